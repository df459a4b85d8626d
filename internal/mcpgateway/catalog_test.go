package mcpgateway

import (
	"encoding/json"
	"os"
	"testing"
)

// TestCatalogMatchesTemplate: the catalog pins each server's version in two
// places, this table (what `mcp-gateway pull` installs) and the mcp-gateway
// template's package.json (what the template ships); they must agree, so
// that a pulled server is the one the template has.
func TestCatalogMatchesTemplate(t *testing.T) {
	b, err := os.ReadFile("../../templates/mcp-gateway/servers/package.json")
	if err != nil {
		t.Fatal(err)
	}
	var pkg struct {
		Dependencies map[string]string `json:"dependencies"`
	}
	if err := json.Unmarshal(b, &pkg); err != nil {
		t.Fatal(err)
	}
	for _, s := range catalog {
		if v, ok := pkg.Dependencies[s.Package]; !ok || v != s.Version {
			t.Errorf("catalog %s: %s@%s, the template's package.json has %q", s.Name, s.Package, s.Version, v)
		}
	}
	if len(pkg.Dependencies) != len(catalog) {
		t.Errorf("the template's package.json has %d packages, the catalog %d servers", len(pkg.Dependencies), len(catalog))
	}
}
