package main

import (
	"net/http"

	"github.com/gin-gonic/gin"
)

// GinMiddleware runs the rest of gin's chain inside a net/http middleware
// (idem's Route): the chain sees the middleware's request (its context
// holds the transaction) and writes to the middleware's writer (which
// buffers the response until it is stored and committed). The README shows
// the same adapter.
func GinMiddleware(mw func(http.Handler) http.Handler) gin.HandlerFunc {
	return func(c *gin.Context) {
		outer := c.Writer
		mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			c.Request = r
			c.Writer = &ginWriter{ResponseWriter: outer, w: w, size: -1}
			c.Next()
		})).ServeHTTP(outer, c.Request)
		c.Writer = outer
		c.Abort() // the chain ran inside, or the middleware answered
	}
}

// ginWriter is gin's ResponseWriter writing to the middleware's writer.
type ginWriter struct {
	gin.ResponseWriter
	w      http.ResponseWriter
	status int
	size   int
}

func (g *ginWriter) Header() http.Header { return g.w.Header() }
func (g *ginWriter) WriteHeader(code int) {
	if g.size < 0 && code > 0 {
		g.status = code
	}
}
func (g *ginWriter) WriteHeaderNow() {
	if g.size < 0 {
		if g.status == 0 {
			g.status = http.StatusOK
		}
		g.w.WriteHeader(g.status)
		g.size = 0
	}
}
func (g *ginWriter) Write(b []byte) (int, error) {
	g.WriteHeaderNow()
	n, err := g.w.Write(b)
	g.size += n
	return n, err
}
func (g *ginWriter) WriteString(s string) (int, error) { return g.Write([]byte(s)) }
func (g *ginWriter) Status() int {
	if g.status == 0 {
		return http.StatusOK
	}
	return g.status
}
func (g *ginWriter) Size() int     { return g.size }
func (g *ginWriter) Written() bool { return g.size >= 0 }
