package main

import (
	"bufio"
	"fmt"
	"net"
	"strings"
)

// listen opens the TCP port on all addresses and announces it on stdout with
// the line tests wait for: "listening on :PORT".
func listen(port int) net.Listener {
	return listenOn("tcp", port)
}

// listenOn is listen on network "tcp" (both families) or "tcp6" (IPv6 only).
func listenOn(network string, port int) net.Listener {
	ln, err := net.Listen(network, fmt.Sprintf(":%d", port))
	if err != nil {
		fatalf("listen on port %d: %v", port, err)
	}
	fmt.Printf("listening on :%d\n", port)
	return ln
}

// httpRequest is the part of an HTTP/1.x request the actor looks at.
type httpRequest struct {
	method, path, userAgent string
}

// isHTTPRequestLine tells whether line looks like "GET /path HTTP/1.1".
func isHTTPRequestLine(line string) bool {
	f := strings.Fields(line)
	return len(f) == 3 && strings.HasPrefix(f[2], "HTTP/") && strings.HasPrefix(f[1], "/")
}

// readHTTPRequest parses the request line (already read) and the headers
// that follow it. The body, if any, is ignored.
func readHTTPRequest(requestLine string, br *bufio.Reader) (httpRequest, error) {
	f := strings.Fields(requestLine)
	req := httpRequest{method: f[0], path: f[1]}
	if i := strings.IndexByte(req.path, '?'); i >= 0 {
		req.path = req.path[:i]
	}
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return req, err
		}
		line = strings.TrimRight(line, "\r\n")
		if line == "" {
			return req, nil
		}
		name, value, ok := strings.Cut(line, ":")
		if ok && strings.EqualFold(strings.TrimSpace(name), "User-Agent") {
			req.userAgent = strings.TrimSpace(value)
		}
	}
}

// isProbe tells whether the request comes from the kubelet's prober.
func (r httpRequest) isProbe() bool {
	return strings.HasPrefix(r.userAgent, "kube-probe/")
}

// writeHTTP writes a complete HTTP/1.1 response and asks to close the
// connection.
func writeHTTP(c net.Conn, status int, contentType, body string) {
	text := map[int]string{200: "OK", 404: "Not Found", 405: "Method Not Allowed"}[status]
	fmt.Fprintf(c, "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		status, text, contentType, len(body), body)
}
