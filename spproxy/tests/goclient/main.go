// A Go proc speaking σOS's spproxy protocol to the embedded realm server over the inherited
// SIGMA_SPPROXY_FD socket, run as the target by supervisor/tests/go_interop.rs.
//
// This is a faithful reimplementation of σOS's Go spproxy client path, NOT σOS's own code:
// github.com/mit-pdos/sigmaos is not available from the Go module proxy. It follows σOS's
// proxy/sigmap/clnt/stubs.go (method names, request fields), rpc/clnt (envelope: Req, message
// with its Blob cleared, blob frames), util/io/frame (u32 length counting itself) and
// util/io/demux (seqnos from 1, replies matched by seqno, pipelined), and it treats replies as
// the Go stubs do: every reply's err is dereferenced, so a missing err is a failure here.
package main

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"sort"
	"strconv"
	"sync"
)

// ---- protobuf wire encoding (the few field kinds the spproxy messages use) ----

type enc struct{ b []byte }

func (e *enc) varint(v uint64) {
	for v >= 0x80 {
		e.b = append(e.b, byte(v)|0x80)
		v >>= 7
	}
	e.b = append(e.b, byte(v))
}
func (e *enc) key(f, wt int) { e.varint(uint64(f<<3 | wt)) }
func (e *enc) u(f int, v uint64) {
	if v != 0 {
		e.key(f, 0)
		e.varint(v)
	}
}
func (e *enc) bytes(f int, v []byte) { e.key(f, 2); e.varint(uint64(len(v))); e.b = append(e.b, v...) }
func (e *enc) str(f int, v string) {
	if v != "" {
		e.bytes(f, []byte(v))
	}
}

// fields decodes one message into field number -> values (varints as uint64, bytes as []byte).
func fields(b []byte) (map[int][]interface{}, error) {
	m := map[int][]interface{}{}
	for len(b) > 0 {
		k, n := binary.Uvarint(b)
		if n <= 0 {
			return nil, fmt.Errorf("bad key")
		}
		b = b[n:]
		f, wt := int(k>>3), int(k&7)
		switch wt {
		case 0:
			v, n := binary.Uvarint(b)
			if n <= 0 {
				return nil, fmt.Errorf("bad varint")
			}
			b = b[n:]
			m[f] = append(m[f], v)
		case 2:
			l, n := binary.Uvarint(b)
			if n <= 0 || uint64(len(b)-n) < l {
				return nil, fmt.Errorf("bad length")
			}
			m[f] = append(m[f], b[n:n+int(l)])
			b = b[n+int(l):]
		default:
			return nil, fmt.Errorf("wire type %d", wt)
		}
	}
	return m, nil
}

func getU(m map[int][]interface{}, f int) uint64 {
	if v, ok := m[f]; ok {
		return v[len(v)-1].(uint64)
	}
	return 0
}
func getB(m map[int][]interface{}, f int) ([]byte, bool) {
	if v, ok := m[f]; ok {
		return v[len(v)-1].([]byte), true
	}
	return nil, false
}

// SigmaError is an Rerror with a non-zero code.
type SigmaError struct {
	Code uint64
	Obj  string
	Msg  string
}

func (e *SigmaError) Error() string {
	return fmt.Sprintf("σOS error %d on %q: %s", e.Code, e.Obj, e.Msg)
}

func rerror(b []byte) error {
	m, err := fields(b)
	if err != nil {
		return err
	}
	if c := getU(m, 1); c != 0 {
		o, _ := getB(m, 2)
		s, _ := getB(m, 3)
		return &SigmaError{c, string(o), string(s)}
	}
	return nil
}

// ---- transport: frames, seqnos, demux ----

type Clnt struct {
	wmu   sync.Mutex
	c     net.Conn
	mu    sync.Mutex
	seq   uint64
	calls map[uint64]chan [][]byte
}

func NewClnt(c net.Conn) *Clnt {
	cl := &Clnt{c: c, calls: map[uint64]chan [][]byte{}}
	go cl.reader()
	return cl
}

func (cl *Clnt) reader() {
	r := bufio.NewReaderSize(cl.c, 1<<16)
	for {
		var hdr [12]byte
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			cl.fail()
			return
		}
		seq := binary.LittleEndian.Uint64(hdr[:8])
		n := binary.LittleEndian.Uint32(hdr[8:])
		frames := make([][]byte, 0, n)
		for i := uint32(0); i < n; i++ {
			var lb [4]byte
			if _, err := io.ReadFull(r, lb[:]); err != nil {
				cl.fail()
				return
			}
			l := binary.LittleEndian.Uint32(lb[:])
			if l < 4 {
				cl.fail()
				return
			}
			f := make([]byte, l-4)
			if _, err := io.ReadFull(r, f); err != nil {
				cl.fail()
				return
			}
			frames = append(frames, f)
		}
		cl.mu.Lock()
		ch := cl.calls[seq]
		delete(cl.calls, seq)
		cl.mu.Unlock()
		if ch != nil {
			ch <- frames
		}
	}
}

func (cl *Clnt) fail() {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	for s, ch := range cl.calls {
		close(ch)
		delete(cl.calls, s)
	}
}

// rpc sends [Req{method}, body, blob...] and returns the reply's message frame and blob
// frames; a one-frame reply is an RPC-level error (rpc/srv/rpcsrv.go).
func (cl *Clnt) rpc(method string, body []byte, blob [][]byte) ([]byte, [][]byte, error) {
	var req enc
	req.str(1, method)
	frames := append([][]byte{req.b, body}, blob...)
	ch := make(chan [][]byte, 1)
	cl.mu.Lock()
	cl.seq++
	seq := cl.seq
	cl.calls[seq] = ch
	cl.mu.Unlock()
	var buf bytes.Buffer
	binary.Write(&buf, binary.LittleEndian, seq)
	binary.Write(&buf, binary.LittleEndian, uint32(len(frames)))
	for _, f := range frames {
		binary.Write(&buf, binary.LittleEndian, uint32(len(f)+4))
		buf.Write(f)
	}
	cl.wmu.Lock()
	_, err := cl.c.Write(buf.Bytes())
	cl.wmu.Unlock()
	if err != nil {
		return nil, nil, err
	}
	rep, ok := <-ch
	if !ok {
		return nil, nil, fmt.Errorf("connection closed")
	}
	if len(rep) == 0 {
		return nil, nil, fmt.Errorf("reply without frames")
	}
	rm, err := fields(rep[0])
	if err != nil {
		return nil, nil, err
	}
	if e, ok := getB(rm, 1); ok {
		if err := rerror(e); err != nil {
			return nil, nil, err
		}
	}
	if len(rep) == 1 {
		return nil, nil, fmt.Errorf("one-frame reply without an RPC error")
	}
	return rep[1], rep[2:], nil
}

// call runs an RPC and checks the reply message's err field (number errField), which must be
// present as in the Go stubs, which dereference it.
func (cl *Clnt) call(method string, body []byte, blob [][]byte, errField int) (map[int][]interface{}, [][]byte, error) {
	msg, rblob, err := cl.rpc(method, body, blob)
	if err != nil {
		return nil, nil, err
	}
	m, err := fields(msg)
	if err != nil {
		return nil, nil, err
	}
	e, ok := getB(m, errField)
	if !ok {
		return nil, nil, fmt.Errorf("%s: reply has no err (the Go stub would dereference nil)", method)
	}
	return m, rblob, rerror(e)
}

const svc = "SPProxySrvAPI."

func (cl *Clnt) Init(pid string) error {
	var pe enc
	pe.str(1, pid)
	pe.str(2, "goclient")
	pe.str(3, "rootrealm")
	var r enc
	r.bytes(1, pe.b)
	_, _, err := cl.call(svc+"Init", r.b, nil, 1)
	return err
}
func (cl *Clnt) null(m string) error { _, _, err := cl.call(svc+m, nil, nil, 1); return err }
func (cl *Clnt) ClntId() (uint64, error) {
	m, _, err := cl.call(svc+"ClntId", nil, nil, 2)
	return getU(m, 1), err
}
func (cl *Clnt) Exited(status uint64, msg string) error {
	var r enc
	r.u(1, status)
	r.str(2, msg)
	_, _, err := cl.call(svc+"Exited", r.b, nil, 1)
	return err
}
func pathReq(p string) []byte { var r enc; r.str(1, p); return r.b }

type Stat struct {
	Name   string
	Length uint64
	Mode   uint64
}

func stat(b []byte) Stat {
	m, _ := fields(b)
	n, _ := getB(m, 8)
	return Stat{string(n), getU(m, 7), getU(m, 4)}
}
func (cl *Clnt) Stat(p string) (Stat, error) {
	m, _, err := cl.call(svc+"Stat", pathReq(p), nil, 2)
	if err != nil {
		return Stat{}, err
	}
	b, _ := getB(m, 1)
	return stat(b), nil
}
func (cl *Clnt) createOrOpen(method, p string, perm, mode uint64, wait bool) (uint64, error) {
	var r enc
	r.str(1, p)
	r.u(2, perm)
	r.u(3, mode)
	if wait {
		r.u(6, 1)
	}
	m, _, err := cl.call(svc+method, r.b, nil, 2)
	return getU(m, 1), err
}
func (cl *Clnt) Create(p string, perm, mode uint64) (uint64, error) {
	return cl.createOrOpen("Create", p, perm, mode, false)
}
func (cl *Clnt) Open(p string, mode uint64) (uint64, error) {
	return cl.createOrOpen("Open", p, 0, mode, false)
}
func (cl *Clnt) Read(fd, size uint64) ([]byte, error) {
	var r enc
	r.u(1, fd)
	r.u(2, size)
	r.u(3, ^uint64(0)) // NoOffset
	_, blob, err := cl.call(svc+"Read", r.b, nil, 2)
	if err != nil {
		return nil, err
	}
	return bytes.Join(blob, nil), nil
}
func (cl *Clnt) Write(fd uint64, data []byte) (uint64, error) {
	var r enc
	r.u(1, fd)
	r.bytes(3, nil) // the cleared Blob stays present
	m, _, err := cl.call(svc+"Write", r.b, [][]byte{data}, 2)
	return getU(m, 1), err
}
func (cl *Clnt) CloseFd(fd uint64) error {
	var r enc
	r.u(1, fd)
	_, _, err := cl.call(svc+"CloseFd", r.b, nil, 1)
	return err
}
func (cl *Clnt) DirWatch(fd uint64) (uint64, error) {
	var r enc
	r.u(1, fd)
	m, _, err := cl.call(svc+"DirWatch", r.b, nil, 2)
	return getU(m, 1), err
}
func (cl *Clnt) PutFile(p string, data []byte) (uint64, error) {
	var r enc
	r.str(1, p)
	r.u(2, 0o777)
	r.u(3, 0x01|0x10) // OWRITE|OTRUNC
	r.u(5, ^uint64(0))
	r.bytes(6, nil)
	m, _, err := cl.call(svc+"PutFile", r.b, [][]byte{data}, 2)
	return getU(m, 1), err
}
func (cl *Clnt) GetFile(p string) ([]byte, error) {
	_, blob, err := cl.call(svc+"GetFile", pathReq(p), nil, 2)
	return bytes.Join(blob, nil), err
}
func (cl *Clnt) Remove(p string) error {
	_, _, err := cl.call(svc+"Remove", pathReq(p), nil, 1)
	return err
}

// GetDir as FsLib does it: open, read whole directory entries until an empty read, close.
func (cl *Clnt) GetDir(p string) ([]string, uint64, error) {
	fd, err := cl.Open(p, 0)
	if err != nil {
		return nil, 0, err
	}
	var names []string
	for {
		b, err := cl.Read(fd, 4096)
		if err != nil {
			return nil, 0, err
		}
		if len(b) == 0 {
			break
		}
		for len(b) > 0 {
			l := binary.LittleEndian.Uint32(b)
			names = append(names, stat(b[4:l]).Name)
			b = b[l:]
		}
	}
	return names, fd, nil
}

func code(err error) uint64 {
	if e, ok := err.(*SigmaError); ok {
		return e.Code
	}
	return 0
}

var failed bool

func check(name string, ok bool, detail ...interface{}) {
	if ok {
		fmt.Println("ok", name)
	} else {
		failed = true
		fmt.Println("FAIL", name, fmt.Sprint(detail...))
	}
}

func main() {
	fdn, err := strconv.Atoi(os.Getenv("SIGMA_SPPROXY_FD"))
	if err != nil {
		fmt.Println("FAIL no SIGMA_SPPROXY_FD")
		os.Exit(1)
	}
	c, err := net.FileConn(os.NewFile(uintptr(fdn), "spproxy"))
	if err != nil {
		fmt.Println("FAIL adopting the spproxy socket:", err)
		os.Exit(1)
	}
	cl := NewClnt(c)
	ux := "name/ux/~local/go"
	check("Init", cl.Init("go-proc-1") == nil)
	check("Started", cl.null("Started") == nil)
	id, err := cl.ClntId()
	check("ClntId", err == nil && id != 0, err)
	_, err = cl.Create(ux, 0x80000000|0o777, 0)
	check("Create dir", err == nil, err)

	big := make([]byte, 8<<20)
	for i := range big {
		big[i] = byte(i * 7)
	}
	n, err := cl.PutFile(ux+"/big", big)
	check("PutFile 8 MiB", err == nil && n == uint64(len(big)), err)
	got, err := cl.GetFile(ux + "/big")
	check("GetFile 8 MiB", err == nil && bytes.Equal(got, big), err)
	st, err := cl.Stat(ux + "/big")
	check("Stat", err == nil && st.Length == uint64(len(big)) && st.Name == "big", err, st)

	fd, err := cl.Create(ux+"/f", 0o644, 0x02)
	check("Create file", err == nil, err)
	_, err = cl.Write(fd, []byte("hello from go"))
	check("Write", err == nil, err)
	check("CloseFd", cl.CloseFd(fd) == nil)
	fd, err = cl.Open(ux+"/f", 0)
	check("Open", err == nil, err)
	b, err := cl.Read(fd, 100)
	check("Read", err == nil && string(b) == "hello from go", err, string(b))
	cl.CloseFd(fd)

	// Error cases, as σOS's errors.
	_, err = cl.Open(ux+"/missing", 0)
	check("missing path is Notfound", code(err) == 13, err)
	_, err = cl.Stat("name/ux/~local/../outside")
	check("escape is Perm", code(err) == 16, err)
	check("removing a non-empty directory is NotEmpty", code(cl.Remove(ux)) == 27)
	_, err = cl.Open(ux+"/f", 0x1000)
	check("bad open flags are Inval", code(err) == 22, err)
	_, _, err = cl.call(svc+"MountTree", nil, nil, 1)
	check("an unserved σOS call is NotSupported, transport intact", code(err) == 21, err)

	// Directory read and DirWatch.
	names, dfd, err := cl.GetDir(ux)
	sort.Strings(names)
	check("GetDir", err == nil && fmt.Sprint(names) == "[big f]", err, names)
	wfd, err := cl.DirWatch(dfd)
	check("DirWatch", err == nil, err)
	cl.CloseFd(dfd)
	done := make(chan []byte)
	go func() { b, _ := cl.Read(wfd, 4096); done <- b }()
	cl.PutFile(ux+"/new", []byte("x"))
	ev := <-done
	ok := len(ev) > 4 && bytes.Contains(ev, []byte("new"))
	check("DirWatch event", ok, ev)

	// 8 concurrent callers pipelined on the connection.
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 25; i++ {
				p := fmt.Sprintf("%s/g%d-%d", ux, g, i)
				d := []byte(p)
				if _, err := cl.PutFile(p, d); err != nil {
					errs <- err
					return
				}
				if got, err := cl.GetFile(p); err != nil || !bytes.Equal(got, d) {
					errs <- fmt.Errorf("%s: %v", p, err)
					return
				}
				if err := cl.Remove(p); err != nil {
					errs <- err
					return
				}
			}
		}(g)
	}
	wg.Wait()
	close(errs)
	e := <-errs
	check("8 concurrent callers", e == nil, e)

	for _, p := range []string{"/big", "/f", "/new", ""} {
		cl.Remove(ux + p)
	}
	if failed {
		cl.Exited(3, "interop failures")
		os.Exit(1)
	}
	// WaitEvict: the test sends the supervisor SIGTERM once this line is out.
	fmt.Println("waiting for eviction")
	err = cl.null("WaitEvict")
	check("WaitEvict", err == nil, err)
	check("Exited", cl.Exited(2, "evicted") == nil)
	if failed {
		os.Exit(1)
	}
}
