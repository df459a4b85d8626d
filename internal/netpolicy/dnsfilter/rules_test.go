package dnsfilter

import "testing"

func TestDecide(t *testing.T) {
	filtered := Rules{Allow: []string{"*.Example.COM", "api.example.org.", "_svc.corp.test"}, DenyAll: true}
	open := Rules{Deny: []string{"*.ads.test", "tracker.test"}}
	both := Rules{Allow: []string{"good.ads.test"}, Deny: []string{"*.ads.test"}}
	everything := Rules{Allow: []string{"*"}, DenyAll: true}
	for _, tc := range []struct {
		rules Rules
		name  string
		want  bool
	}{
		{filtered, "www.example.com", true},
		{filtered, "WWW.EXAMPLE.COM.", true},
		{filtered, "a.b.c.example.com.", true}, // any depth
		{filtered, "example.com", false},       // not the apex
		{filtered, "badexample.com", false},    // label boundary
		{filtered, "example.com.evil.test", false},
		{filtered, `x\.example.com.`, false},   // one label "x.example" under com
		{filtered, `a.x\.example.com.`, false}, // ditto, one level down
		{filtered, `a\.b.example.com.`, true},  // odd label, but really below example.com
		{filtered, `a.example\.com.`, false},   // label "example.com" under the root
		{filtered, `\065.example.com.`, true},  // \065 is 'A'
		{filtered, "api.example.org", true},
		{filtered, "API.example.ORG", true},
		{filtered, "v2.api.example.org", false}, // exact pattern
		{filtered, "example.org", false},
		{filtered, "_svc.corp.test", true},
		{filtered, "", false},
		{filtered, ".", false},
		{filtered, "a..example.com", false}, // not a valid name
		{open, "anything.test", true},
		{open, "x.ads.test", false},
		{open, "ads.test", true},
		{open, "tracker.test", false},
		{open, "a.tracker.test", true},
		{both, "good.ads.test", true}, // allow wins over deny
		{both, "bad.ads.test", false},
		{everything, "anything.at.all", true},
		{everything, ".", true},
		{Rules{}, "x.test", true},
		{Rules{DenyAll: true}, "x.test", false},
		{Rules{Allow: []string{"*.bad pattern"}, DenyAll: true}, "x.bad pattern", false},
	} {
		if got := tc.rules.Decide(tc.name); got != tc.want {
			t.Errorf("%+v.Decide(%q) = %v, want %v", tc.rules, tc.name, got, tc.want)
		}
	}
}

func TestMatchOpensOnlyExplicitAllows(t *testing.T) {
	r := Rules{Allow: []string{"a.test"}, Deny: []string{"b.test"}}
	if v := r.match("a.test"); v != verdictAllowed {
		t.Errorf("a.test: %v", v)
	}
	if v := r.match("c.test"); v != verdictDefaultAllowed {
		t.Errorf("c.test: %v, want default-allowed (resolve, do not open)", v)
	}
	if v := r.match("b.test"); v != verdictDenied {
		t.Errorf("b.test: %v", v)
	}
}

func TestValidPattern(t *testing.T) {
	for _, p := range []string{
		"example.com", "Example.COM.", "*.example.com", "*.example.com.", "*", "localhost",
		"xn--bcher-kva.example", "_dmarc.example.com", "a-b.c-d.e", "*.com",
	} {
		if err := ValidPattern(p); err != nil {
			t.Errorf("ValidPattern(%q) = %v, want nil", p, err)
		}
	}
	for _, p := range []string{
		"", ".", "*.", "**.example.com", "a.*.example.com", "*example.com", "example.*",
		"1.2.3.4", "10.0.0.0/8", "::1", "2001:db8::/32", "example.com:443", "exa mple.com",
		"-a.example.com", "a-.example.com", "a..example.com", "bücher.example", "http://example.com",
		string(make([]byte, 64)) + ".com",
	} {
		if err := ValidPattern(p); err == nil {
			t.Errorf("ValidPattern(%q) = nil, want an error", p)
		}
	}
	long := ""
	for range 50 {
		long += "abcd."
	}
	long += "com" // 253 bytes
	if err := ValidPattern(long); err != nil {
		t.Errorf("253-byte name: %v", err)
	}
	if err := ValidPattern("a" + long); err == nil {
		t.Error("254-byte name accepted")
	}
}
