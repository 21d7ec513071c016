package kubernetes

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"gopkg.in/yaml.v3"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	sigsyaml "sigs.k8s.io/yaml"

	iconfig "github.com/pgoutbox/pgoutbox/internal/config"
	"github.com/pgoutbox/pgoutbox/internal/testenv"
	mconfig "github.com/pgoutbox/pgoutbox/maintain/config"
	connconfig "github.com/pgoutbox/pgoutbox/relay/config"
	swconfig "github.com/pgoutbox/pgoutbox/slotwatch/config"
)

var update = flag.Bool("update", false, "rewrite prometheusrule.yaml and dashboards/ from their sources")

// kinds are the objects the base may hold, each decoded into its API type;
// any other kind fails the test.
var kinds = map[string]func() any{
	"v1/ServiceAccount":                       func() any { return &corev1.ServiceAccount{} },
	"v1/ConfigMap":                            func() any { return &corev1.ConfigMap{} },
	"v1/Service":                              func() any { return &corev1.Service{} },
	"apps/v1/Deployment":                      func() any { return &appsv1.Deployment{} },
	"batch/v1/CronJob":                        func() any { return &batchv1.CronJob{} },
	"policy/v1/PodDisruptionBudget":           func() any { return &policyv1.PodDisruptionBudget{} },
	"monitoring.coreos.com/v1/PodMonitor":     func() any { return &monitoringv1.PodMonitor{} },
	"monitoring.coreos.com/v1/ServiceMonitor": func() any { return &monitoringv1.ServiceMonitor{} },
	"monitoring.coreos.com/v1/PrometheusRule": func() any { return &monitoringv1.PrometheusRule{} },
}

// binary is what the manifests must agree with about one of our binaries.
type binary struct {
	rule iconfig.EnvRule
	// secrets are the settings that must come from a Secret's file.
	secrets []string
	// dsn is the required connection-string setting.
	dsn string
	// listen is the setting of the HTTP address ("" for maintain).
	listen string
}

func binaries(t *testing.T) map[string]binary {
	t.Helper()
	conn := flag.NewFlagSet("connector", flag.ContinueOnError)
	var cc connconfig.Config
	cc.Bind(conn, func(string) string { return "" })
	sw := flag.NewFlagSet("slotwatch", flag.ContinueOnError)
	var sc swconfig.Config
	sc.Bind(sw, func(string) string { return "" })
	mt := flag.NewFlagSet("maintain", flag.ContinueOnError)
	var ms mconfig.Settings
	ms.Bind(mt, func(string) string { return "" })
	return map[string]binary{
		"connector": {rule: iconfig.EnvRule{Known: connconfig.EnvVars()}, secrets: secretSettings(t, conn), dsn: "OUTBOX_PG_DSN", listen: "OUTBOX_HTTP_ADDR"},
		"slotwatch": {rule: iconfig.EnvRule{Known: swconfig.EnvVars()}, secrets: secretSettings(t, sw), dsn: "SLOTWATCH_PG_DSN", listen: "SLOTWATCH_LISTEN"},
		"maintain":  {rule: mconfig.EnvRule(), secrets: secretSettings(t, mt), dsn: "MAINTAIN_PG_DSN"},
	}
}

// secretSettings are the settings whose flag says it is a secret (the
// binder's Secret, routing's registry password): "(secret; prefer the
// environment or NAME_FILE)".
func secretSettings(t *testing.T, fs *flag.FlagSet) []string {
	t.Helper()
	var out []string
	fs.VisitAll(func(f *flag.Flag) {
		if _, rest, ok := strings.Cut(f.Usage, "(secret; prefer the environment or "); ok {
			name, _, _ := strings.Cut(rest, "_FILE)")
			out = append(out, name)
		}
	})
	if len(out) == 0 {
		t.Fatalf("%s: no secret setting found in the flags' usage; has the binder's wording changed?", fs.Name())
	}
	return out
}

// rendered is the base as kubectl apply -k would send it, decoded.
type rendered struct {
	deployments map[string]*appsv1.Deployment
	cronJobs    map[string]*batchv1.CronJob
	configMaps  map[string]*corev1.ConfigMap
	pdbs        []*policyv1.PodDisruptionBudget
	podMonitors []*monitoringv1.PodMonitor
	rules       []*monitoringv1.PrometheusRule
}

// render is the base rendered and decoded once for every test (about a
// second under -race).
func render(t *testing.T) rendered {
	t.Helper()
	r, errs := renderOnce()
	for _, err := range errs {
		t.Error(err)
	}
	if len(errs) > 0 {
		t.FailNow()
	}
	return r
}

var renderOnce = sync.OnceValues(func() (rendered, []error) {
	dir := filepath.Join(testenv.RepoRoot(), "deploy", "kubernetes")
	r := rendered{deployments: map[string]*appsv1.Deployment{}, cronJobs: map[string]*batchv1.CronJob{}, configMaps: map[string]*corev1.ConfigMap{}}
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		return r, []error{fmt.Errorf("kustomize build deploy/kubernetes: %w", err)}
	}
	var errs []error
	for _, res := range m.Resources() {
		raw, err := res.MarshalJSON()
		if err != nil {
			return r, []error{err}
		}
		var tm metav1.TypeMeta
		if err := json.Unmarshal(raw, &tm); err != nil {
			return r, []error{err}
		}
		key := tm.APIVersion + "/" + tm.Kind
		mk, ok := kinds[key]
		if !ok {
			errs = append(errs, fmt.Errorf("%s %s: a kind this test does not know; add its API type", key, res.GetName()))
			continue
		}
		obj := mk()
		// Strictly: a field the API type does not have is a mistake the
		// API server would drop or refuse.
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		if err := dec.Decode(obj); err != nil {
			errs = append(errs, fmt.Errorf("%s %s does not decode into its API type: %w", key, res.GetName(), err))
			continue
		}
		switch o := obj.(type) {
		case *appsv1.Deployment:
			r.deployments[o.Name] = o
		case *batchv1.CronJob:
			r.cronJobs[o.Name] = o
		case *corev1.ConfigMap:
			r.configMaps[o.Name] = o
		case *policyv1.PodDisruptionBudget:
			r.pdbs = append(r.pdbs, o)
		case *monitoringv1.PodMonitor:
			r.podMonitors = append(r.podMonitors, o)
		case *monitoringv1.PrometheusRule:
			r.rules = append(r.rules, o)
		}
	}
	return r, errs
})

// pods are the base's pod templates by workload name.
func (r rendered) pods() map[string]*corev1.PodTemplateSpec {
	out := map[string]*corev1.PodTemplateSpec{}
	for n, d := range r.deployments {
		out[n] = &d.Spec.Template
	}
	for n, c := range r.cronJobs {
		out[n] = &c.Spec.JobTemplate.Spec.Template
	}
	return out
}

// binaryOf is the binary a container runs, by its image
// (pgoutbox/<binary>[:tag]).
func binaryOf(c corev1.Container) string {
	name, _, _ := strings.Cut(strings.TrimPrefix(c.Image, "pgoutbox/"), ":")
	return name
}

// env is a container's environment as the binary sees it: its env entries
// and the keys of the ConfigMaps it takes whole. A value from a field
// reference is "(field)".
func (r rendered) env(t *testing.T, where string, c corev1.Container) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, ef := range c.EnvFrom {
		switch {
		case ef.ConfigMapRef != nil:
			cm, ok := r.configMaps[ef.ConfigMapRef.Name]
			if !ok {
				t.Errorf("%s takes its environment from ConfigMap %s, which the base does not make", where, ef.ConfigMapRef.Name)
				continue
			}
			for k, v := range cm.Data {
				out[ef.Prefix+k] = v
			}
		default:
			t.Errorf("%s: envFrom other than a ConfigMap (%+v): secrets are mounted as files", where, ef)
		}
	}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			out[e.Name] = e.Value
		case e.ValueFrom.FieldRef != nil:
			out[e.Name] = "(field)"
		default:
			t.Errorf("%s: %s comes from %+v: secrets are mounted as files (NAME_FILE)", where, e.Name, e.ValueFrom)
		}
	}
	return out
}

// TestKustomizeBase renders deploy/kubernetes and checks every container:
// the variables it sets are ones its binary reads, secrets come from files
// of mounted Secrets, probes ask the paths the binary serves on the port it
// listens on, and the security context is the restricted one.
func TestKustomizeBase(t *testing.T) {
	r := render(t)
	bins := binaries(t)
	pods := r.pods()
	for _, want := range []string{"pgoutbox-connector", "pgoutbox-slotwatch"} {
		if _, ok := r.deployments[want]; !ok {
			t.Errorf("Deployment %s is missing", want)
		}
	}
	if _, ok := r.cronJobs["pgoutbox-maintain"]; !ok {
		t.Errorf("CronJob pgoutbox-maintain is missing")
	}
	seen := map[string]bool{}
	for name, pod := range pods {
		checkPodSecurity(t, name, pod.Spec)
		secretMounts := map[string]string{} // mount path -> Secret name
		for _, c := range pod.Spec.Containers {
			where := name + "/" + c.Name
			bin, ok := bins[binaryOf(c)]
			if !ok {
				t.Errorf("%s runs image %q, none of our binaries (pgoutbox/connector, slotwatch, maintain)", where, c.Image)
				continue
			}
			seen[binaryOf(c)] = true
			checkContainerSecurity(t, where, c)
			for _, vm := range c.VolumeMounts {
				for _, v := range pod.Spec.Volumes {
					if v.Name == vm.Name && v.Secret != nil {
						secretMounts[vm.MountPath] = v.Secret.SecretName
						if !vm.ReadOnly {
							t.Errorf("%s mounts Secret %s writable", where, v.Secret.SecretName)
						}
						if v.Secret.DefaultMode == nil || *v.Secret.DefaultMode&0o027 != 0 {
							t.Errorf("%s: Secret %s's defaultMode %v lets others read or the group write it", where, v.Secret.SecretName, v.Secret.DefaultMode)
						}
					}
				}
			}
			env := r.env(t, where, c)
			for k, v := range env {
				if !bin.rule.Reads(k) {
					t.Errorf("%s sets %s, which %s does not read", where, k, binaryOf(c))
				}
				if slices.Contains(bin.secrets, k) {
					t.Errorf("%s sets the secret %s as a value; mount it from a Secret and set %s_FILE", where, k, k)
				}
				if base, ok := strings.CutSuffix(k, "_FILE"); ok && bin.rule.Reads(base) && !isSecretFile(v, secretMounts) {
					t.Errorf("%s: %s=%s is not a file of a mounted Secret (mounts %v)", where, k, v, secretMounts)
				}
			}
			if _, ok := env[bin.dsn+"_FILE"]; !ok {
				t.Errorf("%s: %s_FILE is not set: the connection string comes from the Secret's file", where, bin.dsn)
			}
			if bin.listen != "" {
				checkProbes(t, where, c, env[bin.listen])
			}
		}
	}
	for b := range bins {
		if !seen[b] {
			t.Errorf("no workload runs %s", b)
		}
	}
}

func isSecretFile(path string, mounts map[string]string) bool {
	dir, file := filepath.Split(path)
	_, ok := mounts[filepath.Clean(dir)]
	return ok && file != ""
}

func checkPodSecurity(t *testing.T, where string, spec corev1.PodSpec) {
	t.Helper()
	sc := spec.SecurityContext
	switch {
	case sc == nil:
		t.Errorf("%s: no pod securityContext", where)
		return
	case sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot:
		t.Errorf("%s: runAsNonRoot is not true", where)
	case sc.RunAsUser == nil || *sc.RunAsUser == 0:
		// distroless' nonroot user; a numeric one lets the kubelet check
		// runAsNonRoot whatever the image says.
		t.Errorf("%s: runAsUser must name the non-root user (65532)", where)
	case sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault:
		t.Errorf("%s: seccompProfile must be RuntimeDefault", where)
	}
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		t.Errorf("%s: automountServiceAccountToken must be false (the binaries never call the Kubernetes API)", where)
	}
}

func checkContainerSecurity(t *testing.T, where string, c corev1.Container) {
	t.Helper()
	sc := c.SecurityContext
	switch {
	case sc == nil:
		t.Errorf("%s: no container securityContext", where)
	case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
		t.Errorf("%s: readOnlyRootFilesystem is not true", where)
	case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
		t.Errorf("%s: allowPrivilegeEscalation is not false", where)
	case sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0:
		t.Errorf("%s: capabilities must drop ALL and add none", where)
	case sc.Privileged != nil && *sc.Privileged:
		t.Errorf("%s: privileged", where)
	}
}

// checkProbes: the endpoint listens on all addresses (the kubelet and
// Prometheus come from outside the pod), on the port the probes name, and
// the probes ask the paths the binary serves: the connector is ready on
// /readyz (leader or standby) and alive on /healthz (no stall); slotwatch
// serves /healthz only.
func checkProbes(t *testing.T, where string, c corev1.Container, listen string) {
	t.Helper()
	host, port, err := net.SplitHostPort(listen)
	if err != nil || (host != "" && host != "0.0.0.0" && host != "::") {
		t.Errorf("%s: listens on %q; want all addresses (0.0.0.0:PORT) for the kubelet and Prometheus", where, listen)
		return
	}
	ports := map[string]string{}
	for _, p := range c.Ports {
		ports[p.Name] = fmt.Sprint(p.ContainerPort)
	}
	if !slices.Contains(slices.Collect(mapValues(ports)), port) {
		t.Errorf("%s: no containerPort %s (ports %v)", where, port, ports)
	}
	want := map[string]string{"readiness": "/healthz", "liveness": "/healthz"}
	if binaryOf(c) == "connector" {
		want = map[string]string{"readiness": "/readyz", "liveness": "/healthz", "startup": "/healthz"}
	}
	got := map[string]*corev1.Probe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe, "startup": c.StartupProbe}
	for kind, path := range want {
		p := got[kind]
		if p == nil || p.HTTPGet == nil {
			t.Errorf("%s: no %s probe with httpGet %s", where, kind, path)
			continue
		}
		pp := p.HTTPGet.Port.String()
		if p.HTTPGet.Port.Type == intstr.String {
			pp = ports[pp]
		}
		if p.HTTPGet.Path != path || pp != port {
			t.Errorf("%s: %s probe asks %s on port %s; want %s on %s", where, kind, p.HTTPGet.Path, p.HTTPGet.Port.String(), path, port)
		}
	}
}

func mapValues(m map[string]string) func(func(string) bool) {
	return func(yield func(string) bool) {
		for _, v := range m {
			if !yield(v) {
				return
			}
		}
	}
}

// TestConnectorRollout: two or three replicas of one connector; a rollout
// that adds a standby before it stops a pod (the lease decides who
// publishes, and a surge pod is one more standby), with the grace period
// a leader needs to hand over; a PodDisruptionBudget over exactly the
// connector's pods that never lets both go at once.
func TestConnectorRollout(t *testing.T) {
	r := render(t)
	d, ok := r.deployments["pgoutbox-connector"]
	if !ok {
		t.Fatal("Deployment pgoutbox-connector is missing")
	}
	if d.Spec.Replicas == nil || *d.Spec.Replicas < 2 || *d.Spec.Replicas > 3 {
		t.Errorf("connector replicas %v; want 2 or 3 (a leader and hot standbys)", d.Spec.Replicas)
	}
	replicas := int(*d.Spec.Replicas)
	switch s := d.Spec.Strategy; s.Type {
	case appsv1.RecreateDeploymentStrategyType:
	case appsv1.RollingUpdateDeploymentStrategyType:
		ru := s.RollingUpdate
		if ru == nil || ru.MaxUnavailable == nil || ru.MaxSurge == nil {
			t.Fatalf("rolling update %+v: set maxSurge and maxUnavailable", ru)
		}
		if v, _ := intstr.GetScaledValueFromIntOrPercent(ru.MaxUnavailable, replicas, true); v != 0 {
			t.Errorf("maxUnavailable %s: the rollout must start a standby before it stops a pod", ru.MaxUnavailable.String())
		}
		if v, _ := intstr.GetScaledValueFromIntOrPercent(ru.MaxSurge, replicas, true); v != 1 {
			t.Errorf("maxSurge %s; want 1: one new standby at a time", ru.MaxSurge.String())
		}
	default:
		t.Errorf("strategy %q", s.Type)
	}
	sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
	if err != nil || !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
		t.Errorf("the Deployment's selector %v does not match its pods' labels %v", d.Spec.Selector, d.Spec.Template.Labels)
	}
	c := d.Spec.Template.Spec.Containers[0]
	env := r.env(t, "connector", c)
	if s := env["OUTBOX_SOURCE"]; s != "" && s != "wal" {
		t.Errorf("OUTBOX_SOURCE=%s: the base deploys the WAL relay behind the lease", s)
	}
	var def connconfig.Config
	def.Bind(flag.NewFlagSet("connector", flag.ContinueOnError), func(string) string { return "" })
	shutdown := def.ShutdownTimeout
	if v, ok := env["OUTBOX_SHUTDOWN_TIMEOUT"]; ok {
		if shutdown, err = time.ParseDuration(v); err != nil {
			t.Fatalf("OUTBOX_SHUTDOWN_TIMEOUT=%q: %v", v, err)
		}
	}
	grace := d.Spec.Template.Spec.TerminationGracePeriodSeconds
	if grace == nil || time.Duration(*grace)*time.Second <= shutdown {
		t.Errorf("terminationGracePeriodSeconds %v must exceed OUTBOX_SHUTDOWN_TIMEOUT (%s): a leader killed mid-handover leaves the lease to lapse", grace, shutdown)
	}

	var covering int
	for _, pdb := range r.pdbs {
		ps, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
		if err != nil {
			t.Fatalf("PodDisruptionBudget %s: %v", pdb.Name, err)
		}
		for name, pod := range r.pods() {
			if ps.Matches(labels.Set(pod.Labels)) != (name == d.Name) {
				t.Errorf("PodDisruptionBudget %s matches %s: %v; it must cover exactly the connector's pods", pdb.Name, name, ps.Matches(labels.Set(pod.Labels)))
			}
		}
		if ps.Matches(labels.Set(d.Spec.Template.Labels)) {
			covering++
			allowed := 0
			switch {
			case pdb.Spec.MaxUnavailable != nil:
				allowed, _ = intstr.GetScaledValueFromIntOrPercent(pdb.Spec.MaxUnavailable, replicas, true)
			case pdb.Spec.MinAvailable != nil:
				minAvail, _ := intstr.GetScaledValueFromIntOrPercent(pdb.Spec.MinAvailable, replicas, true)
				allowed = replicas - minAvail
			}
			if allowed < 1 || allowed >= replicas {
				t.Errorf("PodDisruptionBudget %s allows %d of %d connector pods down; want at least 1 (drains proceed) and fewer than all (a standby stays)", pdb.Name, allowed, replicas)
			}
		}
	}
	if covering != 1 {
		t.Errorf("%d PodDisruptionBudgets cover the connector; want 1", covering)
	}

	cj := r.cronJobs["pgoutbox-maintain"]
	if cj == nil {
		t.Fatal("CronJob pgoutbox-maintain is missing")
	}
	if cj.Spec.ConcurrencyPolicy != batchv1.ForbidConcurrent {
		t.Errorf("maintain's concurrencyPolicy %q; want Forbid (two runs would fight over the same partitions)", cj.Spec.ConcurrencyPolicy)
	}
	menv := r.env(t, "maintain", cj.Spec.JobTemplate.Spec.Template.Spec.Containers[0])
	if v := menv["MAINTAIN_INTERVAL"]; v != "" && v != "0" && v != "0s" {
		t.Errorf("MAINTAIN_INTERVAL=%s: a CronJob's run must run once and exit", v)
	}
}

// TestMonitoring: the PodMonitors scrape the connector's and slotwatch's
// pods on a port they have, the PrometheusRule's groups are the rules files
// promtool checks, exactly, and the dashboards' ConfigMap holds every
// dashboard as it is in the repository.
func TestMonitoring(t *testing.T) {
	r := render(t)
	pods := r.pods()
	for _, want := range []string{"pgoutbox-connector", "pgoutbox-slotwatch"} {
		found := false
		for _, pm := range r.podMonitors {
			s, err := metav1.LabelSelectorAsSelector(&pm.Spec.Selector)
			if err != nil || !s.Matches(labels.Set(pods[want].Labels)) {
				continue
			}
			found = true
			for _, ep := range pm.Spec.PodMetricsEndpoints {
				if ep.Port == nil || !slices.ContainsFunc(pods[want].Spec.Containers[0].Ports, func(p corev1.ContainerPort) bool { return p.Name == *ep.Port }) {
					t.Errorf("PodMonitor %s scrapes port %v, which %s does not have", pm.Name, ep.Port, want)
				}
				if ep.Path != "/metrics" {
					t.Errorf("PodMonitor %s scrapes %q; want /metrics", pm.Name, ep.Path)
				}
			}
		}
		if !found {
			t.Errorf("no PodMonitor selects %s's pods", want)
		}
	}

	var groups []monitoringv1.RuleGroup
	for _, pr := range r.rules {
		groups = append(groups, pr.Spec.Groups...)
	}
	var want []monitoringv1.RuleGroup
	for _, f := range rulesFiles(t) {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		js, err := sigsyaml.YAMLToJSON(raw)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		var file struct {
			Groups []monitoringv1.RuleGroup `json:"groups"`
		}
		dec := json.NewDecoder(bytes.NewReader(js))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&file); err != nil {
			t.Fatalf("%s does not decode into PrometheusRule groups: %v", f, err)
		}
		want = append(want, file.Groups...)
	}
	if len(want) == 0 || !reflect.DeepEqual(groups, want) {
		g, _ := json.MarshalIndent(groups, "", " ")
		w, _ := json.MarshalIndent(want, "", " ")
		t.Errorf("the PrometheusRule's groups are not the rules files' (%d groups against %d); run go test ./deploy/kubernetes -update\n%s", len(groups), len(want), firstDiff(string(g), string(w)))
	}

	cm, ok := r.configMaps["pgoutbox-dashboards"]
	if !ok {
		t.Fatal("ConfigMap pgoutbox-dashboards is missing")
	}
	if cm.Labels["grafana_dashboard"] != "1" {
		t.Errorf("the dashboards' ConfigMap lacks the label grafana_dashboard=1 that Grafana's sidecar looks for")
	}
	dashboards := dashboardFiles(t)
	if len(cm.Data) != len(dashboards) {
		t.Errorf("the dashboards' ConfigMap holds %d dashboards, the repository %d", len(cm.Data), len(dashboards))
	}
	for _, f := range dashboards {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if cm.Data[filepath.Base(f)] != string(raw) {
			t.Errorf("the dashboards' ConfigMap's %s differs from %s; run go test ./deploy/kubernetes -update", filepath.Base(f), f)
		}
	}
}

// TestGeneratedCopies: the base's copies of the rules and dashboards are
// what their sources make now (-update writes them).
func TestGeneratedCopies(t *testing.T) {
	dir := filepath.Join(testenv.RepoRoot(), "deploy", "kubernetes")
	want := map[string][]byte{"prometheusrule.yaml": prometheusRule(t)}
	for _, f := range dashboardFiles(t) {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		want[filepath.Join("dashboards", filepath.Base(f))] = raw
	}
	for name, b := range want {
		p := filepath.Join(dir, name)
		if *update {
			if err := os.WriteFile(p, b, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		got, err := os.ReadFile(p)
		if err != nil || !bytes.Equal(got, b) {
			t.Errorf("deploy/kubernetes/%s is not what its source makes now (%v); run go test ./deploy/kubernetes -update", name, err)
		}
	}
}

// rulesFiles are the alert rules the project ships, which promtool checks
// (go test ./connector/rules ./slotwatch/rules), in path order.
func rulesFiles(t *testing.T) []string {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(testenv.RepoRoot(), "*", "rules", "*.rules.yml"))
	if len(files) < 2 {
		t.Fatalf("rules files %v; want the connector's and slotwatch's", files)
	}
	return files
}

func dashboardFiles(t *testing.T) []string {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(testenv.RepoRoot(), "*", "dashboards", "*.json"))
	if len(files) == 0 {
		t.Fatal("no dashboard in */dashboards/*.json")
	}
	return files
}

// prometheusRule is prometheusrule.yaml: one PrometheusRule whose groups are
// those of every rules file, taken as they are (comments included).
func prometheusRule(t *testing.T) []byte {
	t.Helper()
	root := testenv.RepoRoot()
	groups := &yaml.Node{Kind: yaml.SequenceNode}
	var sources []string
	for _, f := range rulesFiles(t) {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var doc yaml.Node
		if err := yaml.Unmarshal(raw, &doc); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		literalFolded(&doc)
		top := doc.Content[0]
		for i := 0; i+1 < len(top.Content); i += 2 {
			if top.Content[i].Value == "groups" {
				groups.Content = append(groups.Content, top.Content[i+1].Content...)
			}
		}
		rel, _ := filepath.Rel(root, f)
		sources = append(sources, rel)
	}
	str := func(v string) *yaml.Node { return &yaml.Node{Kind: yaml.ScalarNode, Value: v} }
	mapping := func(kv ...*yaml.Node) *yaml.Node { return &yaml.Node{Kind: yaml.MappingNode, Content: kv} }
	doc := mapping(
		str("apiVersion"), str("monitoring.coreos.com/v1"),
		str("kind"), str("PrometheusRule"),
		str("metadata"), mapping(str("name"), str("pgoutbox")),
		str("spec"), mapping(str("groups"), groups),
	)
	var buf bytes.Buffer
	fmt.Fprintf(&buf, "# Made by `go test ./deploy/kubernetes -update` from %s,\n", strings.Join(sources, " and "))
	buf.WriteString("# the rules files promtool checks; edit those, not this copy.\n")
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(doc); err != nil {
		t.Fatal(err)
	}
	if err := enc.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// literalFolded writes folded scalars (>-) as literal ones (|-) with the
// same value: yaml.v3 does not write a folded scalar whose value keeps a
// line break (a more-indented line) back to the same value.
func literalFolded(n *yaml.Node) {
	if n.Kind == yaml.ScalarNode && n.Style&yaml.FoldedStyle != 0 {
		n.Style = n.Style&^yaml.FoldedStyle | yaml.LiteralStyle
	}
	for _, c := range n.Content {
		literalFolded(c)
	}
}

// TestReadmeNamesSecrets: README's Kubernetes section names every Secret
// the base mounts, with the key the binaries read.
func TestReadmeNamesSecrets(t *testing.T) {
	r := render(t)
	raw, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(raw), "\n## Deploy on Kubernetes\n")
	if !ok {
		t.Fatal(`README.md has no "## Deploy on Kubernetes" section`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	for name, pod := range r.pods() {
		for _, v := range pod.Spec.Volumes {
			if v.Secret == nil {
				continue
			}
			if !strings.Contains(section, "kubectl create secret generic "+v.Secret.SecretName+" ") {
				t.Errorf("README's Kubernetes section does not say how to create Secret %s (mounted by %s)", v.Secret.SecretName, name)
			}
		}
	}
	for _, s := range []string{"kubectl apply -k deploy/kubernetes", "/readyz", "lease"} {
		if !strings.Contains(section, s) {
			t.Errorf("README's Kubernetes section does not mention %s", s)
		}
	}
}

// firstDiff shows the first line where got and want differ.
func firstDiff(got, want string) string {
	g, w := strings.Split(got, "\n"), strings.Split(want, "\n")
	for i := range max(len(g), len(w)) {
		var gl, wl string
		if i < len(g) {
			gl = g[i]
		}
		if i < len(w) {
			wl = w[i]
		}
		if gl != wl {
			return fmt.Sprintf("line %d: got %q, want %q", i+1, gl, wl)
		}
	}
	return "(no line differs)"
}
