// kstatus: the status that Flux, Helm 4 --wait and kpt compute for one object (read as JSON or
// YAML on stdin), printed as {"status": ..., "message": ...}. It calls cli-utils' own
// status.Compute, so tests check the real library rather than a re-implementation of it.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
	"sigs.k8s.io/yaml"
)

func main() {
	in, err := io.ReadAll(os.Stdin)
	if err == nil {
		in, err = yaml.YAMLToJSON(in) // JSON is YAML: both arrive here
	}
	obj := &unstructured.Unstructured{}
	if err == nil {
		err = obj.UnmarshalJSON(in) // the apimachinery decoder: integers stay int64, as from the API
	}
	var res *status.Result
	if err == nil {
		res, err = status.Compute(obj)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "kstatus:", err)
		os.Exit(1)
	}
	out, _ := json.Marshal(map[string]string{"status": res.Status.String(), "message": res.Message})
	fmt.Println(string(out))
}
