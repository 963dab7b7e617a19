package config

import (
	"fmt"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Export writes c as a site file that Load accepts and that loads to the
// same desired state: every section, with the defaults Load filled in
// spelled out, automatic placement frozen as the members it resolved to
// (so that a later change of nodes or arrays cannot move an array's data),
// and the volumes. Keys follow the YAML names (mapstructure tags), so a
// field added to the configuration is exported without change here.
// Secrets (dhchap_secret, dhchap_ctrl_secret) are written only as the
// "file:PATH" references they are; an inline secret is refused, since
// writing it would copy it into every exported file.
func (c *Config) Export() ([]byte, error) {
	for _, f := range []struct {
		key string
		fab Fabric
	}{{"fabrics.backend", c.Fabrics.Backend}, {"fabrics.frontend", c.Fabrics.Frontend}} {
		for k, v := range map[string]string{"dhchap_secret": f.fab.DHCHAPSecret, "dhchap_ctrl_secret": f.fab.DHCHAPCtrlSecret} {
			if v != "" && !strings.HasPrefix(v, "file:") {
				return nil, fmt.Errorf("%s.%s is written inline in the running site file; export does not copy secrets: move it to a file (%s.%s: file:/etc/tier0/%s) and export again", f.key, k, f.key, k, k)
			}
		}
	}
	root := exportValue(reflect.ValueOf(*c))
	for _, f := range []string{"backend", "frontend"} {
		fab := reflect.ValueOf(c.Fabrics).FieldByName(strings.ToUpper(f[:1]) + f[1:]).Interface().(Fabric)
		n := mapValue(mapValue(root, "fabrics"), f)
		if n == nil {
			continue
		}
		if fab.DHCHAPSecret != "" {
			appendPair(n, "dhchap_secret", scalar(fab.DHCHAPSecret))
		}
		if fab.DHCHAPCtrlSecret != "" {
			appendPair(n, "dhchap_ctrl_secret", scalar(fab.DHCHAPCtrlSecret))
		}
	}
	doc := &yaml.Node{Kind: yaml.DocumentNode, Content: []*yaml.Node{root},
		HeadComment: "tier0 site configuration, exported from the live cluster " + c.Cluster + " (tier0 config export).\n" +
			"Automatically placed arrays are written with the members they hold; see docs/CONFIG.md."}
	var b strings.Builder
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(doc); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return []byte(b.String()), nil
}

var (
	sizeType     = reflect.TypeOf(Size(0))
	durationType = reflect.TypeOf(Duration(0))
)

func scalar(s string) *yaml.Node { return &yaml.Node{Kind: yaml.ScalarNode, Value: s} }

func appendPair(m *yaml.Node, key string, v *yaml.Node) {
	m.Content = append(m.Content, scalar(key), v)
}

// mapValue is the value of key in mapping m (nil if absent).
func mapValue(m *yaml.Node, key string) *yaml.Node {
	if m == nil || m.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i+1]
		}
	}
	return nil
}

// exportValue is v as a YAML node, nil when it is a zero value to leave
// out (Load's defaults give it back). Pointers are written whatever they
// point to: a *bool false differs from unset.
func exportValue(v reflect.Value) *yaml.Node {
	switch {
	case v.Type() == sizeType:
		if v.Int() == 0 {
			return nil
		}
		return scalar(Size(v.Int()).String())
	case v.Type() == durationType:
		if v.Int() == 0 {
			return nil
		}
		return scalar(time.Duration(v.Int()).String())
	}
	switch v.Kind() {
	case reflect.Pointer:
		if v.IsNil() {
			return nil
		}
		if n := exportValue(v.Elem()); n != nil {
			return n
		}
		return zeroScalar(v.Elem())
	case reflect.Interface:
		return nil // Array.RawMembers: Members is written instead
	case reflect.Struct:
		m := &yaml.Node{Kind: yaml.MappingNode}
		t := v.Type()
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			tag := f.Tag.Get("mapstructure")
			if !f.IsExported() || tag == "" || tag == "-" || strings.HasPrefix(tag, "dhchap_") {
				continue
			}
			if t == reflect.TypeOf(Array{}) && tag == "members" {
				a := v.Interface().(Array)
				seq := &yaml.Node{Kind: yaml.SequenceNode, Style: yaml.FlowStyle}
				for _, d := range a.Members {
					seq.Content = append(seq.Content, scalar(d))
				}
				appendPair(m, "members", seq)
				continue
			}
			if t == reflect.TypeOf(Array{}) && tag == "width" {
				continue // explicit members: the width is theirs
			}
			if n := exportValue(v.Field(i)); n != nil {
				appendPair(m, tag, n)
			}
		}
		if len(m.Content) == 0 {
			return nil
		}
		return m
	case reflect.Slice:
		if v.Len() == 0 {
			return nil
		}
		seq := &yaml.Node{Kind: yaml.SequenceNode}
		for i := 0; i < v.Len(); i++ {
			n := exportValue(v.Index(i))
			if n == nil {
				n = zeroScalar(v.Index(i))
			}
			seq.Content = append(seq.Content, n)
		}
		return seq
	case reflect.Map:
		if v.Len() == 0 {
			return nil
		}
		keys := v.MapKeys()
		sort.Slice(keys, func(i, j int) bool { return fmt.Sprint(keys[i]) < fmt.Sprint(keys[j]) })
		m := &yaml.Node{Kind: yaml.MappingNode}
		for _, k := range keys {
			n := exportValue(v.MapIndex(k))
			if n == nil {
				n = zeroScalar(v.MapIndex(k))
			}
			appendPair(m, fmt.Sprint(k), n)
		}
		return m
	}
	if v.IsZero() {
		return nil
	}
	return zeroScalar(v)
}

// zeroScalar writes a basic value even when it is zero.
func zeroScalar(v reflect.Value) *yaml.Node {
	switch v.Kind() {
	case reflect.String:
		n := scalar(v.String())
		n.Style = yaml.DoubleQuotedStyle
		return n
	case reflect.Bool:
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!bool", Value: strconv.FormatBool(v.Bool())}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		if v.Type() == sizeType {
			return scalar(Size(v.Int()).String())
		}
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!int", Value: strconv.FormatInt(v.Int(), 10)}
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!int", Value: strconv.FormatUint(v.Uint(), 10)}
	case reflect.Float32, reflect.Float64:
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!float", Value: strconv.FormatFloat(v.Float(), 'g', -1, 64)}
	}
	return &yaml.Node{Kind: yaml.MappingNode}
}

// UnmarshalText reads a Duration as MarshalText writes it ("5s"), so that
// a configuration read back from the API's JSON is the one served.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return fmt.Errorf("duration %q: expected e.g. 5s or 250ms: %w", b, err)
	}
	*d = Duration(v)
	return nil
}
