package kube

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/labels"
)

// TestSelectorAsKubectl holds ParseSelector to apimachinery's labels.Parse, which
// kubectl's --selector uses: the same selectors accepted, the same pods chosen.
func TestSelectorAsKubectl(t *testing.T) {
	sets := []map[string]string{
		nil,
		{"tier": "web"},
		{"tier": "db", "env": "prod"},
		{"tier": "web", "env": "dev", "app.kubernetes.io/name": "checkout"},
		{"replicas": "3", "tier": ""},
		{"replicas": "x"},
	}
	for _, sel := range []string{
		"", "tier", "!tier", "tier=web", "tier==web", "tier!=web", "tier = web",
		"tier=web,env=prod", "tier in (web,db)", "tier in (web, db),env", "tier notin (web)",
		"env notin (prod,dev),!x", "app.kubernetes.io/name=checkout", "tier=", "tier in ()",
		"replicas>2", "replicas<3", "replicas > 2",
		// refused
		"tier=w b", "=web", "tier in web", "tier in (web", "tier=(web)", "!", "-bad=x",
		"Example.COM/x=y", "tier=web,", ",tier", "replicas>two", "tier==web==db",
		"a/b/c=x", "tier=" + strings.Repeat("a", 64), "tier=" + strings.Repeat("a", 63), strings.Repeat("k", 64) + "=x",
	} {
		want, wantErr := labels.Parse(sel)
		got, err := ParseSelector(sel)
		if (err != nil) != (wantErr != nil) {
			t.Errorf("ParseSelector(%q) error %v; labels.Parse says %v", sel, err, wantErr)
			continue
		}
		if err != nil {
			continue
		}
		for _, set := range sets {
			if g, w := got.Matches(set), want.Matches(labels.Set(set)); g != w {
				t.Errorf("%q on %v: Matches %v, labels %v", sel, set, g, w)
			}
		}
	}
}
