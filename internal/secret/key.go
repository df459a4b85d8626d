package secret

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// KeySize is the length of the secrets key: AES-256.
const KeySize = 32

// sealFormat is the first byte of every sealed value, so a later format (a
// rotated key scheme, another cipher) can be told apart.
const sealFormat = 1

// tmpPrefix names the temporary files a key is written to before it is
// linked into place.
const tmpPrefix = ".secrets.key.tmp-"

// ErrKey means a stored value cannot be decrypted with the server's key: the
// key file is not the one it was sealed with, or the record is damaged.
var ErrKey = errors.New("secret cannot be decrypted with this server's key")

// LoadOrCreateKey returns the key in the file at path (64 hex digits), made
// once with crypto/rand when the file does not exist. The new key is written
// to a temporary file in the same directory, synced, then hard-linked to
// path: the link is atomic and never replaces a file, so a crash leaves
// either no key file or a whole one, and two servers racing both end with
// the same key. A file that exists but holds no valid key is an error, never
// replaced: the stored secrets may be sealed with what it held.
func LoadOrCreateKey(path string) (key []byte, created bool, err error) {
	dir := filepath.Dir(path)
	// A crash between writing a temporary key and linking it leaves the
	// temporary file; it holds a key nothing was sealed with. Only old ones
	// go: a young one may be another process's, about to be linked.
	leftovers, _ := filepath.Glob(filepath.Join(dir, tmpPrefix+"*"))
	for _, f := range leftovers {
		if fi, err := os.Stat(f); err == nil && time.Since(fi.ModTime()) > time.Minute {
			_ = os.Remove(f)
		}
	}
	key, err = readKey(path)
	if err == nil || !errors.Is(err, fs.ErrNotExist) {
		return key, false, err
	}
	key = make([]byte, KeySize)
	if _, err := rand.Read(key); err != nil {
		return nil, false, fmt.Errorf("secrets key: %w", err)
	}
	f, err := os.CreateTemp(dir, tmpPrefix+"*") // mode 0600
	if err != nil {
		return nil, false, fmt.Errorf("secrets key: %w", err)
	}
	tmp := f.Name()
	defer os.Remove(tmp)
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return nil, false, fmt.Errorf("secrets key: %w", err)
	}
	if _, err := f.WriteString(hex.EncodeToString(key) + "\n"); err != nil {
		f.Close()
		return nil, false, fmt.Errorf("secrets key: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return nil, false, fmt.Errorf("secrets key: %w", err)
	}
	if err := f.Close(); err != nil {
		return nil, false, fmt.Errorf("secrets key: %w", err)
	}
	if err := os.Link(tmp, path); err != nil {
		if errors.Is(err, fs.ErrExist) { // made meanwhile by someone else: theirs it is
			key, err := readKey(path)
			return key, false, err
		}
		return nil, false, fmt.Errorf("secrets key: %w", err)
	}
	if d, err := os.Open(dir); err == nil {
		err = d.Sync()
		d.Close()
		if err != nil {
			return nil, false, fmt.Errorf("secrets key: sync %s: %w", dir, err)
		}
	}
	return key, true, nil
}

func readKey(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("secrets key: %w", err)
	}
	key, err := hex.DecodeString(strings.TrimSpace(string(b)))
	if err != nil || len(key) != KeySize {
		return nil, fmt.Errorf("secrets key %s does not hold a key (%d hex digits expected); it is not replaced, since the stored secrets may be sealed with what it held: restore it from a backup, or move it away to start with a new key (every stored secret then has to be set again)", path, 2*KeySize)
	}
	return key, nil
}

// sealer encrypts values with AES-256-GCM. Every value is bound to its
// secret's owner and ID (the additional data), so a sealed value copied into
// another row of the database does not decrypt there.
type sealer struct {
	aead  cipher.AEAD
	keyID string
}

func newSealer(key []byte) (*sealer, error) {
	if len(key) != KeySize {
		return nil, fmt.Errorf("secrets key: %d bytes, want %d", len(key), KeySize)
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("secrets key: %w", err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, fmt.Errorf("secrets key: %w", err)
	}
	// The key's ID is a digest of it under a label of its own: it tells keys
	// apart and says nothing about them.
	sum := sha256.Sum256(append([]byte("airlock secrets key id\x00"), key...))
	return &sealer{aead: aead, keyID: hex.EncodeToString(sum[:8])}, nil
}

func additionalData(owner, id string) []byte {
	return []byte("airlock secret v1\x00" + owner + "\x00" + id)
}

// seal returns format byte || nonce || ciphertext+tag.
func (s *sealer) seal(owner, id string, value []byte) ([]byte, error) {
	out := make([]byte, 1+s.aead.NonceSize(), 1+s.aead.NonceSize()+len(value)+s.aead.Overhead())
	out[0] = sealFormat
	if _, err := rand.Read(out[1:]); err != nil {
		return nil, fmt.Errorf("secret: nonce: %w", err)
	}
	return s.aead.Seal(out, out[1:], value, additionalData(owner, id)), nil
}

// open decrypts what seal made for the same owner and ID; the error never
// carries any of the value.
func (s *sealer) open(owner, id string, sealed []byte) ([]byte, error) {
	n := s.aead.NonceSize()
	if len(sealed) < 1+n+s.aead.Overhead() || sealed[0] != sealFormat {
		return nil, fmt.Errorf("%w: secret %s: the stored value is malformed", ErrKey, id)
	}
	value, err := s.aead.Open(nil, sealed[1:1+n], sealed[1+n:], additionalData(owner, id))
	if err != nil {
		return nil, fmt.Errorf("%w: secret %s: authentication failed (wrong key or damaged record)", ErrKey, id)
	}
	return value, nil
}
