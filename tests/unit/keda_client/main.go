// KEDA's own external-scaler client (github.com/kedacore/keda/v2 pkg/scalers/externalscaler, the
// code KEDA's operator calls external scalers with) against the router waker's scaler
// (tests/unit/test_waker_push.py builds and runs it). Usage: keda_client SCALER_ADDRESS WAKER_ADDRESS.
// Prints one line per answer: the method, then its answer (protobuf text) or error.
package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"time"

	pb "github.com/kedacore/keda/v2/pkg/scalers/externalscaler"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

func main() {
	conn, err := grpc.NewClient(os.Args[1], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		panic(err)
	}
	c := pb.NewExternalScalerClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ref := &pb.ScaledObjectRef{Name: "tiny-llama-zero", Namespace: "team",
		ScalerMetadata: map[string]string{"scalerAddress": os.Args[1], "requestsPerReplica": "16"}}
	spec, err := c.GetMetricSpec(ctx, ref)
	fmt.Println("GetMetricSpec", spec, err)
	if specs, err := c.StreamMetricSpec(ctx, ref); err == nil {
		first, err := specs.Recv()
		fmt.Println("StreamMetricSpec", first, err)
	}
	active, err := c.IsActive(ctx, ref)
	fmt.Println("IsActive", active.GetResult(), err)
	stream, err := c.StreamIsActive(ctx, ref)
	if err != nil {
		panic(err)
	}
	pushed, err := stream.Recv()
	fmt.Println("StreamIsActive", pushed.GetResult(), err)
	go func() { // a generation request the stand-in Envoy holds 1.5 s
		req, _ := http.NewRequest("POST", "http://"+os.Args[2]+"/v1/completions", nil)
		req.Header.Set("X-Fake", "json:1.5")
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	sent := time.Now()
	pushed, err = stream.Recv()
	fmt.Println("StreamIsActive", pushed.GetResult(), err, time.Since(sent).Seconds())
	metrics, err := c.GetMetrics(ctx, &pb.GetMetricsRequest{ScaledObjectRef: ref, MetricName: "held"})
	fmt.Println("GetMetrics", metrics, err)
	pushed, err = stream.Recv()
	fmt.Println("StreamIsActive", pushed.GetResult(), err, time.Since(sent).Seconds())
}
