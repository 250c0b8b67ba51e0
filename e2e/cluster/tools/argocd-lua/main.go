// argocd-lua: runs an Argo CD resource customization script (health.lua, discovery.lua,
// action.lua) on one object (JSON or YAML on stdin) the way Argo CD's util/lua does for a script
// from argocd-cm: gopher-lua (Lua 5.1) with only the package, base and table libraries and an os
// table reduced to time and date, the object as the global `obj`, a 1 s limit, and the returned
// table turned into JSON by gopher-json. Argo CD itself is too large a module to build here.
//
// Usage: argocd-lua health|discovery|action SCRIPT < object; prints the result as JSON.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"time"

	lua "github.com/yuin/gopher-lua"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	luajson "layeh.com/gopher-json"
	"sigs.k8s.io/yaml"
)

func main() {
	if len(os.Args) != 3 {
		fail(fmt.Errorf("usage: argocd-lua health|discovery|action SCRIPT < object"))
	}
	script, err := os.ReadFile(os.Args[2])
	if err != nil {
		fail(err)
	}
	in, err := io.ReadAll(os.Stdin)
	if err == nil {
		in, err = yaml.YAMLToJSON(in)
	}
	obj := &unstructured.Unstructured{}
	if err == nil {
		err = obj.UnmarshalJSON(in) // integers as int64, as the application controller has them
	}
	if err != nil {
		fail(err)
	}
	out, err := run(os.Args[1], obj.Object, string(script))
	if err != nil {
		fail(err)
	}
	fmt.Println(string(out))
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "argocd-lua:", err)
	os.Exit(1)
}

// run mirrors util/lua's runLua and the Execute{HealthLua,ResourceActionDiscovery,ResourceAction}.
func run(kind string, obj map[string]any, script string) ([]byte, error) {
	l := lua.NewState(lua.Options{SkipOpenLibs: true})
	defer l.Close()
	for _, lib := range []struct {
		n string
		f lua.LGFunction
	}{{lua.LoadLibName, lua.OpenPackage}, {lua.BaseLibName, lua.OpenBase}, {lua.TabLibName, lua.OpenTable}, {lua.OsLibName, lua.OpenOs}} {
		l.Push(l.NewFunction(lib.f))
		l.Push(lua.LString(lib.n))
		l.Call(1, 0)
	}
	// Argo CD's "safe" os library: gopher-lua's own time and date, nothing else.
	osLib := l.GetGlobal(lua.OsLibName).(*lua.LTable)
	var drop []lua.LValue
	osLib.ForEach(func(k, _ lua.LValue) {
		if k.String() != "time" && k.String() != "date" {
			drop = append(drop, k)
		}
	})
	for _, k := range drop {
		osLib.RawSet(k, lua.LNil)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	l.SetContext(ctx)
	l.SetGlobal("actionParams", l.NewTable())
	l.SetGlobal("obj", decode(l, obj))
	if err := l.DoString(script); err != nil {
		if apiErr, ok := err.(*lua.ApiError); ok && apiErr.Type == lua.ApiErrorRun {
			apiErr.StackTrace = "" // as Argo CD shows it to users
		}
		return nil, err
	}
	ret := l.Get(-1)
	if ret.Type() == lua.LTNil && kind == "health" {
		return []byte(`{"status":"","message":""}`), nil
	}
	if ret.Type() != lua.LTTable {
		return nil, fmt.Errorf("expect table output from Lua script, not %s", ret.Type())
	}
	encoded, err := luajson.Encode(ret)
	if err != nil {
		return nil, err
	}
	switch kind {
	case "health":
		return health(encoded)
	case "discovery":
		return discovery(encoded)
	case "action":
		return action(encoded, obj)
	}
	return nil, fmt.Errorf("unknown script kind %q", kind)
}

func health(encoded []byte) ([]byte, error) {
	hs := struct {
		Status  string `json:"status"`
		Message string `json:"message"`
	}{}
	if string(encoded) != "[]" { // an empty Lua table encodes as an array: an empty status
		if err := json.Unmarshal(encoded, &hs); err != nil {
			return nil, err
		}
	}
	switch hs.Status {
	case "Unknown", "Progressing", "Suspended", "Healthy", "Degraded", "Missing":
	default:
		hs.Status, hs.Message = "Unknown", "Lua returned an invalid health status"
	}
	return json.Marshal(hs)
}

// discovery lists the offered actions sorted by name; an action is enabled unless disabled=true.
func discovery(encoded []byte) ([]byte, error) {
	actions := map[string]any{}
	if string(encoded) != "[]" {
		if err := json.Unmarshal(encoded, &actions); err != nil {
			return nil, fmt.Errorf("error unmarshaling action table: %w", err)
		}
	}
	out := []map[string]any{}
	for name, value := range actions {
		action := map[string]any{"name": name, "disabled": false}
		if fields, ok := value.(map[string]any); ok {
			for k, v := range fields {
				action[k] = v
			}
			if _, ok := action["disabled"].(bool); !ok {
				action["disabled"] = false
			}
		}
		out = append(out, action)
	}
	sort.Slice(out, func(i, j int) bool { return out[i]["name"].(string) < out[j]["name"].(string) })
	return json.Marshal(out)
}

// action returns the object to patch (an old-style action), with empty tables that stood for
// objects turned back into objects, as Argo CD's cleanReturnedObj does.
func action(encoded []byte, before map[string]any) ([]byte, error) {
	if len(encoded) > 0 && encoded[0] == '[' {
		return nil, fmt.Errorf("new-style (list) action output is not used by these scripts")
	}
	after := map[string]any{}
	if err := json.Unmarshal(encoded, &after); err != nil {
		return nil, err
	}
	return json.Marshal(clean(after, before))
}

func clean(after, before map[string]any) map[string]any {
	for k, was := range before {
		switch now := after[k].(type) {
		case map[string]any:
			if wasMap, ok := was.(map[string]any); ok {
				after[k] = clean(now, wasMap)
			}
		case []any:
			if _, ok := was.(map[string]any); ok && len(now) == 0 {
				after[k] = map[string]any{}
			}
		}
	}
	return after
}

func decode(l *lua.LState, value any) lua.LValue {
	switch v := value.(type) {
	case bool:
		return lua.LBool(v)
	case float64:
		return lua.LNumber(v)
	case int64:
		return lua.LNumber(v)
	case string:
		return lua.LString(v)
	case []any:
		arr := l.CreateTable(len(v), 0)
		for _, item := range v {
			arr.Append(decode(l, item))
		}
		return arr
	case map[string]any:
		tbl := l.CreateTable(0, len(v))
		for k, item := range v {
			tbl.RawSetH(lua.LString(k), decode(l, item))
		}
		return tbl
	}
	return lua.LNil
}
