package netpolicytest

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	goruntime "runtime"
	"strconv"
	"sync"
	"time"

	"github.com/vishvananda/netns"
)

// Egress stand-ins, on Web2: an HTTPS server that records what it receives
// (RulesHost and PlainHost name it, with a certificate from the test's own
// CA), and a SOCKS5 server of the test's own.
const (
	RulesHost = "api.rules.test"
	PlainHost = "plain.rules.test"
	// SOCKSUser and SOCKSPassword are what the SOCKS5 server accepts.
	SOCKSUser     = "airlock"
	SOCKSPassword = "socks-password-7f3a"
)

// SOCKSAddr is where the stand-in SOCKS5 server listens; HTTPSAddr the
// recording HTTPS server.
var (
	SOCKSAddr = netip.AddrPortFrom(Web2, 1080)
	HTTPSAddr = netip.AddrPortFrom(Web2, 443)
)

func init() {
	// The egress names, added to the stand-in DNS's table.
	Names[RulesHost+"."] = Web2
	Names[PlainHost+"."] = Web2
}

// Request is what the HTTPS server received.
type Request struct {
	SNI, Host, Path string
	Header          http.Header
}

// SOCKSConn is a connection the SOCKS5 server was asked for.
type SOCKSConn struct {
	User string
	// Target is host:port as the client sent it; Domain reports ATYP=domain.
	Target string
	Domain bool
}

// EgressServers are the running egress stand-ins.
type EgressServers struct {
	// CA signed the HTTPS server's certificate; CAPEM is it in PEM.
	CA    *x509.CertPool
	CAPEM []byte

	mu    sync.Mutex
	reqs  []Request
	socks []SOCKSConn
}

// Requests returns what the HTTPS server has received so far.
func (e *EgressServers) Requests() []Request {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]Request(nil), e.reqs...)
}

// SOCKSConns returns the connections the SOCKS5 server was asked for.
func (e *EgressServers) SOCKSConns() []SOCKSConn {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]SOCKSConn(nil), e.socks...)
}

// StartEgress starts the HTTPS and SOCKS5 stand-ins; they stop with the
// internet.
func (in *Internet) StartEgress(t TB) *EgressServers {
	t.Helper()
	e, err := in.Egress()
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// Egress starts the HTTPS and SOCKS5 stand-ins outside a test; they stop
// with the internet.
func (in *Internet) Egress() (*EgressServers, error) {
	caCert, caKey, err := testCA()
	if err != nil {
		return nil, fmt.Errorf("stand-in CA: %w", err)
	}
	leaf, err := testLeaf(caCert, caKey)
	if err != nil {
		return nil, fmt.Errorf("stand-in certificate: %w", err)
	}
	e := &EgressServers{CA: x509.NewCertPool()}
	e.CA.AddCert(caCert)
	e.CAPEM = pemCert(caCert.Raw)
	hl, err := in.listen(HTTPSAddr.String())
	if err != nil {
		return nil, err
	}
	sl, err := in.listen(SOCKSAddr.String())
	if err != nil {
		hl.Close()
		return nil, err
	}
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			sni := ""
			if r.TLS != nil {
				sni = r.TLS.ServerName
			}
			e.mu.Lock()
			e.reqs = append(e.reqs, Request{SNI: sni, Host: r.Host, Path: r.URL.Path, Header: r.Header.Clone()})
			n := len(e.reqs)
			e.mu.Unlock()
			// Never echo header values: the test looks for a secret inside
			// the sandbox, where this answer goes.
			fmt.Fprintf(w, "recorded request %d for %s\n", n, r.Host)
		}),
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{leaf}},
		ReadHeaderTimeout: 5 * time.Second,
	}
	go func() { _ = srv.ServeTLS(hl, "", "") }()
	go e.serveSOCKS(sl)
	in.closers = append(in.closers, func() { srv.Close(); sl.Close() })
	return e, nil
}

// listen opens a TCP listener inside the internet's namespace.
func (in *Internet) listen(addr string) (net.Listener, error) {
	type res struct {
		l   net.Listener
		err error
	}
	ch := make(chan res, 1)
	go func() {
		goruntime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			ch <- res{err: err}
			return
		}
		defer orig.Close()
		ns, err := netns.GetFromPath(in.nsPath)
		if err != nil {
			ch <- res{err: err}
			return
		}
		defer ns.Close()
		if err := netns.Set(ns); err != nil {
			ch <- res{err: err}
			goruntime.UnlockOSThread()
			return
		}
		l, lerr := net.Listen("tcp4", addr)
		if err := netns.Set(orig); err != nil {
			ch <- res{err: errors.Join(lerr, err)}
			return // the thread stays locked and is discarded
		}
		goruntime.UnlockOSThread()
		ch <- res{l, lerr}
	}()
	r := <-ch
	if r.err != nil {
		return nil, fmt.Errorf("listen %s in the stand-in internet: %w", addr, r.err)
	}
	return r.l, nil
}

// serveSOCKS is a SOCKS5 server (RFC 1928 CONNECT, RFC 1929 user/password)
// for tests: small enough to read, and it records what it was asked, which
// is what the tests check. Targets are dialled from the host's namespace,
// where the stand-in internet is routed; names resolve through Names.
func (e *EgressServers) serveSOCKS(l net.Listener) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			up, err := e.socksHandshake(c)
			if err != nil {
				return
			}
			defer up.Close()
			_ = c.SetDeadline(time.Time{})
			go func() { _, _ = io.Copy(up, c); up.Close() }()
			_, _ = io.Copy(c, up)
		}()
	}
}

func (e *EgressServers) socksHandshake(c net.Conn) (net.Conn, error) {
	r := bufio.NewReader(c)
	hdr := make([]byte, 2)
	if _, err := io.ReadFull(r, hdr); err != nil || hdr[0] != 5 {
		return nil, errors.New("not SOCKS5")
	}
	methods := make([]byte, hdr[1])
	if _, err := io.ReadFull(r, methods); err != nil {
		return nil, err
	}
	hasUserPass := false
	for _, m := range methods {
		hasUserPass = hasUserPass || m == 2
	}
	if !hasUserPass {
		_, _ = c.Write([]byte{5, 0xff})
		return nil, errors.New("no acceptable method")
	}
	_, _ = c.Write([]byte{5, 2})
	ver, _ := r.ReadByte()
	ulen, _ := r.ReadByte()
	user := make([]byte, ulen)
	_, _ = io.ReadFull(r, user)
	plen, _ := r.ReadByte()
	pass := make([]byte, plen)
	if _, err := io.ReadFull(r, pass); err != nil || ver != 1 {
		return nil, errors.New("bad auth request")
	}
	if string(user) != SOCKSUser || string(pass) != SOCKSPassword {
		_, _ = c.Write([]byte{1, 1})
		return nil, errors.New("bad credentials")
	}
	_, _ = c.Write([]byte{1, 0})
	req := make([]byte, 4)
	if _, err := io.ReadFull(r, req); err != nil || req[0] != 5 || req[1] != 1 {
		return nil, errors.New("not CONNECT")
	}
	var host string
	domain := false
	switch req[3] {
	case 1:
		a := make([]byte, 4)
		_, _ = io.ReadFull(r, a)
		host = netip.AddrFrom4([4]byte(a)).String()
	case 3:
		n, _ := r.ReadByte()
		d := make([]byte, n)
		_, _ = io.ReadFull(r, d)
		host, domain = string(d), true
	default:
		return nil, errors.New("unsupported address type")
	}
	pb := make([]byte, 2)
	if _, err := io.ReadFull(r, pb); err != nil {
		return nil, err
	}
	target := net.JoinHostPort(host, strconv.Itoa(int(binary.BigEndian.Uint16(pb))))
	e.mu.Lock()
	e.socks = append(e.socks, SOCKSConn{User: string(user), Target: target, Domain: domain})
	e.mu.Unlock()
	dial := target
	if domain {
		a, ok := Names[host+"."]
		if !ok {
			_, _ = c.Write([]byte{5, 4, 0, 1, 0, 0, 0, 0, 0, 0})
			return nil, errors.New("unknown host")
		}
		dial = net.JoinHostPort(a.String(), strconv.Itoa(int(binary.BigEndian.Uint16(pb))))
	}
	up, err := net.DialTimeout("tcp4", dial, 5*time.Second)
	if err != nil {
		_, _ = c.Write([]byte{5, 5, 0, 1, 0, 0, 0, 0, 0, 0})
		return nil, err
	}
	_, _ = c.Write([]byte{5, 0, 0, 1, 0, 0, 0, 0, 0, 0})
	return up, nil
}

func testCA() (*x509.Certificate, *ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "netpolicytest stand-in CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	return cert, key, err
}

func testLeaf(ca *x509.Certificate, caKey *ecdsa.PrivateKey) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: RulesHost},
		DNSNames: []string{RulesHost, PlainHost}, IPAddresses: []net.IP{net.IP(Web2.AsSlice())},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der, ca.Raw}, PrivateKey: key}, nil
}

func pemCert(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}
