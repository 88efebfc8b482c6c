{{/*
Names. Every object is named <fullname>-<component>: the fullname is
fullnameOverride, else <release>-<name> (just <release> when it contains the
name), the name nameOverride or the chart's; at most 50 characters, so a
component's name stays a DNS label (63), as Service names must be.
*/}}
{{- define "basalt.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 50 | trimSuffix "-" -}}
{{- end -}}

{{- define "basalt.fullname" -}}
{{- $name := include "basalt.name" . -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- else if contains $name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* The common labels; pass (dict "root" $ "component" "store-node"). */}}
{{- define "basalt.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
{{ include "basalt.selectorLabels" . }}
{{- end -}}

{{/* The labels a component's selectors match on (immutable once deployed). */}}
{{- define "basalt.selectorLabels" -}}
app.kubernetes.io/name: {{ include "basalt.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "basalt.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "basalt.etcdName" -}}
{{ include "basalt.fullname" . }}-etcd
{{- end -}}

{{/*
etcd's client endpoints as Basalt's --etcd takes them (host:port,host:port):
the external ones, or each bundled member's stable DNS name.
*/}}
{{- define "basalt.etcdEndpoints" -}}
{{- if .Values.etcd.external -}}
{{- .Values.etcd.external -}}
{{- else -}}
{{- $name := include "basalt.etcdName" . -}}
{{- $members := list -}}
{{- range $i := until (int .Values.etcd.replicas) -}}
{{- $members = append $members (printf "%s-%d.%s.%s.svc.cluster.local:2379" $name $i $name $.Release.Namespace) -}}
{{- end -}}
{{- join "," $members -}}
{{- end -}}
{{- end -}}

{{/*
A config: map as a RocketMQ broker.conf file, key=value, keys sorted. Whole
numbers are printed as integers: Helm reads every YAML number as a float, and
1073741824 would otherwise render as 1.073741824e+09.
*/}}
{{- define "basalt.configFile" -}}
{{- $lines := list -}}
{{- range $key := keys . | sortAlpha -}}
{{- $value := get $ $key -}}
{{- if and (kindIs "float64" $value) (eq (float64 (int64 $value)) $value) -}}
{{- $value = int64 $value -}}
{{- end -}}
{{- $lines = append $lines (printf "%s=%v" $key $value) -}}
{{- end -}}
{{- join "\n" $lines -}}
{{- end -}}

{{/*
What every Basalt container shares: the settings the chart gives through the
environment (the etcd endpoints, the cluster, the log format), pass the root.
*/}}
{{- define "basalt.commonEnv" -}}
- name: BASALT_ETCD
  value: {{ include "basalt.etcdEndpoints" . | quote }}
- name: BASALT_CLUSTER
  value: {{ .Values.clusterName | quote }}
- name: BASALT_LOG_FORMAT
  value: {{ .Values.log.format | quote }}
- name: BASALT_LOG_LEVEL
  value: {{ .Values.log.level | quote }}
{{- if .Values.tls.enabled }}
- name: BASALT_TLS_ENABLE
  value: "true"
- name: BASALT_TLS_CERT_FILE
  value: /etc/basalt/tls/tls.crt
- name: BASALT_TLS_KEY_FILE
  value: /etc/basalt/tls/tls.key
- name: BASALT_TLS_CA_FILE
  value: /etc/basalt/tls/ca.crt
- name: BASALT_TLS_CLIENT_AUTH
  value: {{ .Values.tls.clientAuth | default "REQUIRE" | quote }}
{{- end }}
{{- if .Values.auth.enabled }}
- name: BASALT_AUTH_ENABLED
  value: "true"
- name: BASALT_AUTH_CREDENTIALS_FILE
  value: /etc/basalt/auth/admin.json
- name: BASALT_AUTH_CLUSTER_KEY_FILE
  value: /etc/basalt/auth/cluster.key
- name: BASALT_AUTH_CLOCK_SKEW_S
  value: {{ .Values.auth.clockSkewSeconds | quote }}
{{- end }}
{{- end -}}

{{/*
A probe's check of a Basalt container's gRPC health on its port: Kubernetes'
own gRPC probe, which cannot speak TLS, so with tls.enabled `basalt health`
on localhost instead (it dials with the container's BASALT_TLS_* settings).
Pass (dict "root" $ "port" 10911).
*/}}
{{- define "basalt.healthCheck" -}}
{{- if .root.Values.tls.enabled -}}
exec:
  command: ["basalt", "health", "localhost:{{ .port }}", "--timeout-s", "3"]
{{- else -}}
grpc:
  port: {{ .port }}
{{- end -}}
{{- end -}}

{{/*
A probe: the health check on the port, then its timings from values (the
component's probes.<kind>). Pass (dict "root" $ "port" 10911 "timing" <map>).
*/}}
{{- define "basalt.probe" -}}
{{ include "basalt.healthCheck" (dict "root" .root "port" .port) }}
{{- with .timing }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/*
A Basalt container's args after the service name: its config file, and the
metrics endpoint on all interfaces (the scraper comes from another pod).
Pass (dict "root" $ "component" "store-node").
*/}}
{{- define "basalt.commonArgs" -}}
- --config
- /etc/basalt/{{ .component }}.conf
- --metrics-port
- {{ .root.Values.metrics.port | quote }}
- --metrics-host
- 0.0.0.0
{{- end -}}

{{/* The pod annotations Prometheus' kubernetes_sd scrape config reads. */}}
{{- define "basalt.scrapeAnnotations" -}}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .Values.metrics.port | quote }}
prometheus.io/path: /metrics
{{- if .Values.tls.enabled }}
prometheus.io/scheme: https
{{- end }}
{{- end -}}

{{/* Volume mounts every Basalt container has: its config file, TLS if enabled. */}}
{{- define "basalt.volumeMounts" -}}
- name: config
  mountPath: /etc/basalt/{{ .component }}.conf
  subPath: {{ .component }}.conf
  readOnly: true
{{- if .root.Values.tls.enabled }}
- name: tls
  mountPath: /etc/basalt/tls
  readOnly: true
{{- end }}
{{- if .root.Values.auth.enabled }}
- name: auth
  mountPath: /etc/basalt/auth
  readOnly: true
{{- end }}
{{- with .root.Values.extraVolumeMounts }}
{{ toYaml . }}
{{- end }}
{{- with .values.extraVolumeMounts }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* A Basalt pod's volumes; pass (dict "root" $ "values" <component values>). */}}
{{- define "basalt.volumes" -}}
- name: config
  configMap:
    name: {{ include "basalt.fullname" .root }}-config
{{- if .root.Values.tls.enabled }}
- name: tls
  secret:
    secretName: {{ required "tls.secretName is required when tls.enabled" .root.Values.tls.secretName }}
{{- end }}
{{- if .root.Values.auth.enabled }}
- name: auth
  secret:
    secretName: {{ include "basalt.authSecretName" .root }}
    defaultMode: 0400
{{- end }}
{{- with .root.Values.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- with .values.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Extra environment of a Basalt container: the release-wide, then the component's. */}}
{{- define "basalt.extraEnv" -}}
{{- with concat (.root.Values.extraEnv | default list) (.values.extraEnv | default list) -}}
{{- toYaml . -}}
{{- end -}}
{{- end -}}

{{/*
A pod template's labels: the component's own (which its selector matches and
no value may change), then the component's podLabels, then the release-wide
podLabels. Pass (dict "root" $ "component" "store-node" "values" <component values>).
*/}}
{{- define "basalt.podLabels" -}}
{{- $chart := fromYaml (include "basalt.labels" (dict "root" .root "component" .component)) -}}
{{- $labels := merge $chart (deepCopy (.values.podLabels | default dict)) (deepCopy (.root.Values.podLabels | default dict)) -}}
{{- toYaml $labels -}}
{{- end -}}

{{/*
A pod template's annotations: the component's podAnnotations, then the
release-wide ones, then the chart's (pass them as "chart": the scrape
annotations, the config checksum), so a value can override the chart's.
*/}}
{{- define "basalt.podAnnotations" -}}
{{- $annotations := merge (deepCopy (.values.podAnnotations | default dict)) (deepCopy (.root.Values.podAnnotations | default dict)) .chart -}}
{{- with $annotations }}
{{- toYaml . -}}
{{- end }}
{{- end -}}

{{/*
What every pod of the chart sets the same way: its ServiceAccount, the
priority class (the component's, else the release-wide one), where it may run
(nodeSelector, tolerations, topology spread). Affinity is the workload's own
(basalt.affinity). Pass (dict "root" $ "values" <component values>).
*/}}
{{- define "basalt.podPlacement" -}}
serviceAccountName: {{ include "basalt.serviceAccountName" .root }}
automountServiceAccountToken: {{ .root.Values.serviceAccount.automount }}
{{- with (.values.priorityClassName | default .root.Values.priorityClassName) }}
priorityClassName: {{ . | quote }}
{{- end }}
{{- with .values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.topologySpreadConstraints }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/*
A workload's affinity: the component's affinity value, with the chart's pod
anti-affinity (one pod of the component per node, preferred or required)
unless that value has a podAntiAffinity of its own. "extraSelector" narrows
the pods kept apart (a broker group's label: its members, each on a node).
Pass (dict "root" $ "component" "store-node" "values" <component values> "required" false).
*/}}
{{- define "basalt.affinity" -}}
{{- $affinity := deepCopy (.values.affinity | default dict) -}}
{{- if not (hasKey $affinity "podAntiAffinity") -}}
{{- $selector := fromYaml (include "basalt.selectorLabels" (dict "root" .root "component" .component)) -}}
{{- $selector = merge $selector (deepCopy (.extraSelector | default dict)) -}}
{{- $term := dict "topologyKey" "kubernetes.io/hostname" "labelSelector" (dict "matchLabels" $selector) -}}
{{- if .required -}}
{{- $_ := set $affinity "podAntiAffinity" (dict "requiredDuringSchedulingIgnoredDuringExecution" (list $term)) -}}
{{- else -}}
{{- $_ := set $affinity "podAntiAffinity" (dict "preferredDuringSchedulingIgnoredDuringExecution" (list (dict "weight" 100 "podAffinityTerm" $term))) -}}
{{- end -}}
{{- end -}}
{{- toYaml $affinity -}}
{{- end -}}

{{/* The pods' ServiceAccount: the one the chart makes, or the one named. */}}
{{- define "basalt.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "basalt.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The Secret with the internal admin user (admin.json) and the cluster key. */}}
{{- define "basalt.authSecretName" -}}
{{- .Values.auth.existingSecret | default (printf "%s-auth" (include "basalt.fullname" .)) -}}
{{- end -}}

{{/* The pod security context: the image's non-root user. */}}
{{- define "basalt.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .Values.securityContext.runAsUser }}
runAsGroup: {{ .Values.securityContext.runAsGroup }}
fsGroup: {{ .Values.securityContext.fsGroup }}
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "basalt.containerSecurityContext" -}}
allowPrivilegeEscalation: false
capabilities:
  drop:
    - ALL
{{- end -}}
