package main

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/localenv"
)

// debezium is Debezium Server (Quarkus, from Maven Central's
// debezium-server-dist) with the PostgreSQL connector (pgoutput), the
// outbox EventRouter and the Kafka sink: the side-by-side anchor.
type debezium struct {
	log     *slog.Logger
	root    string
	java    string // java binary, 21+
	javaVer string
	home    string
	version string
	err     error
	props   string // the last configuration, for the report
}

// debeziumMinJava is what Debezium 3.x (Quarkus 3) needs.
const debeziumMinJava = 21

func (d *debezium) install(ctx context.Context) {
	java, ver, err := localenv.FindJava(d.java, debeziumMinJava)
	if err != nil {
		d.err = fmt.Errorf("%w, or set BENCH_DEBEZIUM_JAVA", err)
		return
	}
	d.java, d.javaVer = java, ver
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(d.root, "bench", "debezium", "install.sh"))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		d.err = fmt.Errorf("bench/debezium/install.sh: %w: %s", err, tailString(stderr.String(), 2000))
		return
	}
	d.home = strings.TrimSpace(string(out))
	runners, _ := filepath.Glob(filepath.Join(d.home, "debezium-server-*-runner.jar"))
	if len(runners) == 0 {
		d.err = fmt.Errorf("no debezium-server-*-runner.jar in %s", d.home)
		return
	}
	d.version = strings.TrimSuffix(strings.TrimPrefix(filepath.Base(runners[0]), "debezium-server-dist-"), "-runner.jar")
	d.log.Info("Debezium Server ready", "home", d.home, "version", d.version, "java", ver)
}

func (d *debezium) status() DebeziumStatus {
	s := DebeziumStatus{Enabled: true, Version: d.version, Java: d.javaVer, Home: d.home}
	if d.err != nil {
		s.Error = d.err.Error()
	}
	return s
}

// debeziumProps is the application.properties of one Debezium Server run.
// The producer is given what the connector's has (acks=all, idempotence,
// lz4) so that both do the same work; everything else is Debezium's default
// (max.batch.size 2048, max.queue.size 8192, poll.interval.ms 500 and the
// Kafka client's linger.ms 5).
const debeziumProps = `# Written by the bench for one run.
debezium.sink.type=kafka
debezium.sink.kafka.producer.bootstrap.servers={{brokers}}
debezium.sink.kafka.producer.key.serializer=org.apache.kafka.common.serialization.StringSerializer
debezium.sink.kafka.producer.value.serializer=org.apache.kafka.common.serialization.StringSerializer
debezium.sink.kafka.producer.acks=all
debezium.sink.kafka.producer.enable.idempotence=true
debezium.sink.kafka.producer.compression.type=lz4
debezium.source.connector.class=io.debezium.connector.postgresql.PostgresConnector
debezium.source.offset.storage.file.filename={{dir}}/data/offsets.dat
debezium.source.offset.flush.interval.ms=0
debezium.source.database.hostname=127.0.0.1
debezium.source.database.port={{port}}
debezium.source.database.user=postgres
debezium.source.database.password=postgres
debezium.source.database.dbname=outbox
debezium.source.topic.prefix=bench
debezium.source.plugin.name=pgoutput
debezium.source.slot.name={{slot}}
debezium.source.publication.name=outbox_pub
debezium.source.publication.autocreate.mode=disabled
debezium.source.table.include.list=public.outbox
debezium.source.snapshot.mode=no_data
debezium.source.tombstones.on.delete=false
debezium.transforms=outbox
debezium.transforms.outbox.type=io.debezium.transforms.outbox.EventRouter
debezium.format.key=json
debezium.format.value=json
debezium.format.key.schemas.enable=false
debezium.format.value.schemas.enable=false
quarkus.http.port={{http}}
quarkus.log.level=INFO
quarkus.log.console.json=false
`

// start returns a relayStart that runs Debezium Server on a slot, in its own
// working directory (config/application.properties, data/offsets.dat).
func (d *debezium) start(b *bench) relayStart {
	return func(slot string) (*sysProc, error) {
		if d.err != nil {
			return nil, d.err
		}
		dir, err := os.MkdirTemp(b.env.tmp, "debezium-")
		if err != nil {
			return nil, err
		}
		for _, sub := range []string{"config", "data"} {
			if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
				return nil, err
			}
		}
		http, err := localenv.FreePort()
		if err != nil {
			return nil, err
		}
		props := strings.NewReplacer("{{brokers}}", b.env.brokers, "{{dir}}", dir, "{{port}}", strconv.Itoa(b.env.pg.Port),
			"{{slot}}", slot, "{{http}}", strconv.Itoa(http)).Replace(debeziumProps)
		d.props = props
		if err := os.WriteFile(filepath.Join(dir, "config", "application.properties"), []byte(props), 0o644); err != nil {
			return nil, err
		}
		runners, _ := filepath.Glob(filepath.Join(d.home, "debezium-server-*-runner.jar"))
		if len(runners) == 0 {
			return nil, fmt.Errorf("no runner jar in %s", d.home)
		}
		// As the distribution's run.sh does, without its JMX and agent
		// options, so that the JVM is the process measured.
		cp := strings.Join([]string{runners[0], filepath.Join(d.home, "config", "lib"), filepath.Join(d.home, "lib", "*")}, ":")
		env := []string{"PATH=" + b.getenv("PATH"), "HOME=" + b.getenv("HOME"), "JAVA_HOME=" + filepath.Dir(filepath.Dir(d.java))}
		return startProc("debezium", dir, b.env.tmp, d.java, []string{"-cp", cp, "io.debezium.server.Main"}, env)
	}
}
