{{/* The name of kcache's objects: the release's, as deploy/ names them ("kcache"). */}}
{{- define "kcache.name" -}}
{{- .Release.Name | trunc 58 | trimSuffix "-" -}}
{{- end -}}

{{- define "kcache.natsName" -}}
{{- printf "%s-nats" (include "kcache.name" .) -}}
{{- end -}}

{{/* Labels every object carries; selectors use app.kubernetes.io/name only. */}}
{{- define "kcache.labels" -}}
app.kubernetes.io/part-of: kcache
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* kcache.toml of this release: the fleet's when NATS is on. */}}
{{- define "kcache.config" -}}
{{- if .Values.fleet.enabled }}{{ .Values.fleet.config }}{{ else }}{{ .Values.config }}{{ end -}}
{{- end -}}

{{/* nats.conf of the fleet's NATS cluster (deploy/nats/nats.conf, routes for its size). */}}
{{- define "kcache.natsConf" -}}
{{- $nats := include "kcache.natsName" . -}}
# nats-server 2.9 for kcache (docs/nats.md). $POD_NAME and the password come from the
# pod's environment.
server_name: $POD_NAME
listen: 0.0.0.0:4222
pid_file: /var/run/nats/nats.pid
http: 0.0.0.0:8222
# kcache chunks larger bodies itself ([nats] max_chunk_bytes = 0 follows this).
max_payload: 1MB

jetstream {
  store_dir: /data/jetstream
  max_file_store: 1GB
  max_memory_store: 64MB
}

cluster {
  name: kcache
  listen: 0.0.0.0:6222
  routes: [
    nats://kcache-nats-0.kcache-nats.kcache.svc:6222
    nats://kcache-nats-1.kcache-nats.kcache.svc:6222
    nats://kcache-nats-2.kcache-nats.kcache.svc:6222
  ]
}

# NATS is a read path around Kubernetes RBAC: only kcache's replicas publish and
# subscribe, and only on kcache's subjects and its lease bucket (docs/nats.md).
authorization {
  users: [
    {
      user: kcache
      password: $KCACHE_NATS_PASSWORD
      permissions: {
        publish: ["kcache.>", "_KCACHE_INBOX.>", "$KV.kcache-leases.>", "$JS.API.STREAM.CREATE.KV_kcache-leases", "$JS.API.STREAM.MSG.DELETE.KV_kcache-leases", "$JS.API.STREAM.MSG.GET.KV_kcache-leases"]
        subscribe: ["kcache.>", "_KCACHE_INBOX.>"]
      }
    }
  ]
}
{{- end -}}
