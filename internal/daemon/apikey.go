package daemon

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/airlock-sandbox/airlock/internal/layout"
)

// ParseAPIKeys splits a comma-separated list of keys (AIRLOCK_API_KEY: rate
// limits and the sandbox cap apply to each key on its own).
func ParseAPIKeys(list string) ([]string, error) {
	var keys []string
	for _, k := range strings.Split(list, ",") {
		if k = strings.TrimSpace(k); k != "" {
			keys = append(keys, k)
		}
	}
	if len(keys) == 0 {
		return nil, errors.New("the API key list holds no key")
	}
	return keys, nil
}

// StoredAPIKey returns the key kept in the data dir, made on first use in the
// e2b_<40 hex> shape the Python SDK insists on.
func StoredAPIKey(dir layout.DataDir) (string, error) {
	path := dir.APIKey()
	if b, err := os.ReadFile(path); err == nil && len(strings.TrimSpace(string(b))) > 0 {
		return strings.TrimSpace(string(b)), nil
	}
	raw := make([]byte, 20)
	if _, err := rand.Read(raw); err != nil {
		return "", fmt.Errorf("generate an API key: %w", err)
	}
	key := "e2b_" + hex.EncodeToString(raw)
	if err := os.WriteFile(path, []byte(key+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("save api key: %w", err)
	}
	return key, nil
}
