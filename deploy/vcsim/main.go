// Command vcsim-gw serves a simulated vCenter (or standalone ESXi host) over HTTPS for the gateway's
// tests, benchmarks and demo. It wraps govmomi's simulator package (Debian's 0.24.2) and adds an
// optional, test-only control endpoint for behaviour no SOAP method can produce (see README.md).
//
// On start it prints exactly one line to stdout:
//
//	VCSIM_URL=https://127.0.0.1:PORT/sdk CONTROL_URL=http://127.0.0.1:PORT2 INSTANCE_UUID=... PID=...
//
// (CONTROL_URL=- when the control endpoint is off) and serves until SIGINT or SIGTERM.
package main

import (
	"crypto/tls"
	"flag"
	"fmt"
	"log"
	"net"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/vmware/govmomi/simulator"
)

type options struct {
	listen         string
	model          string
	datacenters    int
	clusters       int
	clusterHosts   int
	standalone     int
	vms            int
	datastores     int
	username       string
	password       string
	instanceUUID   string
	delay          int
	methodDelay    string
	idleTimeout    time.Duration
	control        string
	exitWithParent bool
	orphanCleanup  string
}

func parseFlags(args []string) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("vcsim-gw", flag.ContinueOnError)
	fs.StringVar(&o.listen, "listen", "127.0.0.1:0", "host:port for the HTTPS SOAP endpoint (port 0 picks a free one)")
	fs.StringVar(&o.model, "model", "vpx", "vpx (a vCenter) or esx (a standalone ESXi host)")
	fs.IntVar(&o.datacenters, "dc", 1, "datacenters (vpx only)")
	fs.IntVar(&o.clusters, "cluster", 1, "clusters per datacenter (vpx only)")
	fs.IntVar(&o.clusterHosts, "host", 3, "hosts per cluster (vpx only)")
	fs.IntVar(&o.standalone, "standalone-host", 1, "standalone hosts per datacenter (vpx only)")
	fs.IntVar(&o.vms, "vm", 2, "VMs per resource pool: per cluster root pool and per standalone host (esx: on the host)")
	fs.IntVar(&o.datastores, "ds", 1, "local datastores per datacenter, mounted on all its hosts (at least 1)")
	fs.StringVar(&o.username, "username", "", "when set (with -password), the only user that may log in")
	fs.StringVar(&o.password, "password", os.Getenv("VCSIM_PASSWORD"),
		"password for -username (default: $VCSIM_PASSWORD, which keeps it out of the process list)")
	fs.StringVar(&o.instanceUUID, "instance-uuid", "", "about.instanceUuid (vpx default: a random uuid; esx: unset)")
	fs.IntVar(&o.delay, "delay", 0, "milliseconds added to every SOAP call")
	fs.StringVar(&o.methodDelay, "method-delay", "", "per-method delays, e.g. PowerOnVM_Task=2000,RetrievePropertiesEx=50")
	fs.DurationVar(&o.idleTimeout, "session-idle-timeout", 0, "expire sessions idle for this long (0: never)")
	fs.StringVar(&o.control, "control", "", "loopback host:port for the test-only control endpoint (off unless set)")
	fs.BoolVar(&o.exitWithParent, "exit-with-parent", false, "shut down when the parent process goes away")
	fs.StringVar(&o.orphanCleanup, "orphan-cleanup", "",
		"with -exit-with-parent: a disposable directory (absolute path) the parent made for us, deleted if it goes away")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	return o, o.validate()
}

func (o *options) validate() error {
	if o.model != "vpx" && o.model != "esx" {
		return fmt.Errorf("-model must be vpx or esx, got %q", o.model)
	}
	if (o.username == "") != (o.password == "") {
		return fmt.Errorf("-username and -password must be given together")
	}
	if o.datastores < 1 {
		return fmt.Errorf("-ds must be at least 1 (VMs are placed on LocalDS_0)")
	}
	for name, v := range map[string]int{"-dc": o.datacenters, "-cluster": o.clusters, "-host": o.clusterHosts,
		"-standalone-host": o.standalone, "-vm": o.vms, "-delay": o.delay} {
		if v < 0 {
			return fmt.Errorf("%s must not be negative", name)
		}
	}
	if o.instanceUUID != "" {
		if _, err := uuid.Parse(o.instanceUUID); err != nil {
			return fmt.Errorf("-instance-uuid: %v", err)
		}
	}
	if o.orphanCleanup != "" && (!filepath.IsAbs(o.orphanCleanup) || filepath.Clean(o.orphanCleanup) == "/") {
		return fmt.Errorf("-orphan-cleanup must be an absolute path below the root")
	}
	_, err := parseMethodDelay(o.methodDelay)
	return err
}

// parseMethodDelay reads "Method=ms,Method2=ms" into a map.
func parseMethodDelay(spec string) (map[string]int, error) {
	delays := map[string]int{}
	for _, item := range strings.Split(spec, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		parts := strings.SplitN(item, "=", 2)
		if len(parts) != 2 {
			return nil, fmt.Errorf("-method-delay: %q is not Method=ms", item)
		}
		ms, err := strconv.Atoi(parts[1])
		if err != nil || ms < 0 {
			return nil, fmt.Errorf("-method-delay: %q: milliseconds must be a non-negative integer", item)
		}
		delays[strings.TrimSpace(parts[0])] = ms
	}
	return delays, nil
}

func newModel(o *options) *simulator.Model {
	var m *simulator.Model
	if o.model == "esx" {
		m = simulator.ESX()
	} else {
		m = simulator.VPX()
		m.Datacenter = o.datacenters
		m.Cluster = o.clusters
		m.ClusterHost = o.clusterHosts
		m.Host = o.standalone
		if o.instanceUUID == "" {
			o.instanceUUID = uuid.New().String()
		}
	}
	m.Machine = o.vms
	m.Datastore = o.datastores
	if o.instanceUUID != "" {
		m.ServiceContent.About.InstanceUuid = o.instanceUUID
	}
	delays, _ := parseMethodDelay(o.methodDelay)
	m.DelayConfig = simulator.DelayConfig{Delay: o.delay, MethodDelay: delays}
	return m
}

func main() {
	log.SetFlags(log.LstdFlags | log.Lmicroseconds)
	log.SetPrefix("vcsim-gw: ")
	o, err := parseFlags(os.Args[1:])
	if err != nil {
		if err == flag.ErrHelp {
			os.Exit(0)
		}
		log.Printf("%v", err)
		os.Exit(2)
	}
	os.Exit(run(o))
}

// run builds the inventory, serves it and returns the exit code once a signal arrives.
func run(o *options) int {
	// Subscribe first: a signal that arrives while the inventory is built or right after the URL is
	// announced must still lead to a clean shutdown.
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM)

	// Every temp folder the simulator creates (one per datastore) lands under a private directory that we
	// remove on exit, whatever TMPDIR the caller set.
	private, err := os.MkdirTemp("", "vcsim-gw-")
	if err != nil {
		log.Printf("cannot create a temp directory: %v", err)
		return 1
	}
	defer os.RemoveAll(private)
	_ = os.Setenv("TMPDIR", private)

	simulator.SessionIdleTimeout = o.idleTimeout
	m := newModel(o)
	defer m.Remove()
	if err = m.Create(); err != nil {
		log.Printf("cannot create the inventory: %v", err)
		return 1
	}
	if err = serve(o, m, signals); err != nil {
		log.Printf("%v", err)
		return 1
	}
	return 0
}

func serve(o *options, m *simulator.Model, signals <-chan os.Signal) error {
	simulator.Map.AddHandler(recorder) // task history (taskhistory.go)
	m.Service.TLS = new(tls.Config)
	m.Service.Listen = &url.URL{Host: o.listen}
	if o.username != "" {
		m.Service.Listen.User = url.UserPassword(o.username, o.password)
	}
	server, err := startServer(m)
	if err != nil {
		return err
	}
	defer closeServer(server)

	admin := &adminClient{url: *server.URL}
	gate := newInterceptor(server.Config.Handler, admin)
	// Installed before the URL is announced; only a request racing to a fixed -listen port could miss it.
	server.Config.Handler = gate

	controlURL := "-"
	if o.control != "" {
		ctl, err := startControl(o.control, &controller{model: m, gate: gate, admin: admin, options: o})
		if err != nil {
			return err
		}
		defer ctl.Close()
		controlURL = "http://" + ctl.Addr
	}

	public := *server.URL
	public.User = nil
	fmt.Printf("VCSIM_URL=%s CONTROL_URL=%s INSTANCE_UUID=%s PID=%d\n",
		public.String(), controlURL, orDash(o.instanceUUID), os.Getpid())
	_ = os.Stdout.Sync()

	if orphaned := waitForShutdown(signals, o.exitWithParent); orphaned && o.orphanCleanup != "" {
		defer os.RemoveAll(o.orphanCleanup) // nobody is left to read the log in it
	}
	gate.shutdown()
	return nil
}

// startServer turns the simulator's listener panic (address in use, bad address) into an error.
func startServer(m *simulator.Model) (server *simulator.Server, err error) {
	if _, _, err = net.SplitHostPort(m.Service.Listen.Host); err != nil {
		return nil, fmt.Errorf("-listen: %v", err)
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("cannot listen on %s: %v", m.Service.Listen.Host, r)
		}
	}()
	return m.Service.NewServer(), nil
}

// closeServer drops every connection (long polls and slow calls included) and waits briefly for handlers.
func closeServer(server *simulator.Server) {
	server.CloseClientConnections()
	done := make(chan struct{})
	go func() {
		server.Close()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(3 * time.Second):
		log.Printf("some requests were still running at shutdown")
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// waitForShutdown blocks until a signal arrives or, with exitWithParent, the parent exits (then true).
func waitForShutdown(signals <-chan os.Signal, exitWithParent bool) bool {
	orphaned := make(chan struct{})
	if exitWithParent {
		go watchParent(os.Getppid(), orphaned)
	}
	select {
	case sig := <-signals:
		log.Printf("received %v, shutting down", sig)
		return false
	case <-orphaned:
		log.Printf("parent process exited, shutting down")
		return true
	}
}

// watchParent closes done when this process is re-parented, i.e. the process that started it is gone.
func watchParent(parent int, done chan<- struct{}) {
	for range time.Tick(500 * time.Millisecond) {
		if os.Getppid() != parent {
			close(done)
			return
		}
	}
}
