{{/*
Names. The StatefulSet name is also the prefix of the pod names, which the controller parses
strictly (`<statefulset>-<ordinal>`), and of its leases. At most 52 characters, so that the
StatefulSet's controller-revision-hash label (name plus 11 characters) stays within 63.
*/}}
{{- define "shardwise.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 52 | trimSuffix "-" }}
{{- end }}

{{- define "shardwise.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "shardwise.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "shardwise.selectorLabels" -}}
app.kubernetes.io/name: {{ include "shardwise.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "shardwise.labels" -}}
helm.sh/chart: {{ include "shardwise.chart" . }}
{{ include "shardwise.selectorLabels" . }}
app.kubernetes.io/component: controller
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "shardwise.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "shardwise.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "shardwise.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/*
A duration of the controller (whole numbers with units ms, s, m, h, as values.schema.json
requires) in seconds, as a float.
*/}}
{{- define "shardwise.seconds" -}}
{{- $units := dict "ms" 0.001 "s" 1.0 "m" 60.0 "h" 3600.0 }}
{{- $total := 0.0 }}
{{- range regexFindAll "[0-9]+(ms|s|m|h)" (toString .) -1 }}
{{- $count := regexFind "^[0-9]+" . | float64 }}
{{- $unit := regexReplaceAll "^[0-9]+" . "" }}
{{- $total = addf $total (mulf $count (get $units $unit)) }}
{{- end }}
{{- $total }}
{{- end }}

{{/*
Seconds between SIGTERM and SIGKILL: the value, checked, or shutdownTimeout plus the lease
release (bounded by renewDeadline / 2 per attempt) plus a margin.
*/}}
{{- define "shardwise.terminationGracePeriodSeconds" -}}
{{- $c := .Values.controller }}
{{- $shutdown := include "shardwise.seconds" $c.shutdownTimeout | float64 }}
{{- $release := divf (include "shardwise.seconds" $c.renewDeadline | float64) 2 }}
{{- $needed := addf $shutdown $release }}
{{- if kindIs "invalid" .Values.terminationGracePeriodSeconds }}
{{- addf $needed 10 | ceil | int }}
{{- else if le (float64 .Values.terminationGracePeriodSeconds) $needed }}
{{- fail (printf "terminationGracePeriodSeconds (%v) must exceed controller.shutdownTimeout plus controller.renewDeadline / 2 (%v s): a replica must release its leases before it is killed" .Values.terminationGracePeriodSeconds $needed) }}
{{- else }}
{{- .Values.terminationGracePeriodSeconds | int }}
{{- end }}
{{- end }}

{{/*
The controller refuses these lease timings at startup; refuse them at install instead.
*/}}
{{- define "shardwise.checkLeaseTiming" -}}
{{- $c := .Values.controller }}
{{- $duration := include "shardwise.seconds" $c.leaseDuration | float64 }}
{{- $deadline := include "shardwise.seconds" $c.renewDeadline | float64 }}
{{- $retry := include "shardwise.seconds" $c.retryPeriod | float64 }}
{{- if lt $duration 1.0 }}
{{- fail "controller.leaseDuration must be at least 1s" }}
{{- end }}
{{- if gt (addf $deadline 1) $duration }}
{{- fail "controller.renewDeadline must be at least 1s shorter than controller.leaseDuration" }}
{{- end }}
{{- if ge $retry $deadline }}
{{- fail "controller.retryPeriod must be shorter than controller.renewDeadline" }}
{{- end }}
{{- end }}

{{/*
The pod's affinity: the user's, whole, when given; otherwise an anti-affinity of the release's
replicas on nodes, so that one node going down does not take several shards with it.
*/}}
{{- define "shardwise.affinity" -}}
{{- if .Values.affinity }}
{{- toYaml .Values.affinity }}
{{- else if eq .Values.podAntiAffinity "soft" }}
podAntiAffinity:
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- include "shardwise.selectorLabels" . | nindent 12 }}
{{- else if eq .Values.podAntiAffinity "hard" }}
podAntiAffinity:
  requiredDuringSchedulingIgnoredDuringExecution:
    - topologyKey: kubernetes.io/hostname
      labelSelector:
        matchLabels:
          {{- include "shardwise.selectorLabels" . | nindent 10 }}
{{- end }}
{{- end }}

{{/*
"true" when the PrometheusRule has a rule to carry: an empty group is invalid for the Prometheus
operator, so with every alert off and no extraRules nothing is rendered, nor named in NOTES.txt.
Its alerts are the controller's: none without it.
*/}}
{{- define "shardwise.prometheusRuleRendered" -}}
{{- $v := .Values.prometheusRule }}
{{- $any := gt (len $v.extraRules) 0 }}
{{- range $v.alerts }}
{{- if .enabled }}{{ $any = true }}{{ end }}
{{- end }}
{{- if and $v.enabled $any .Values.controller.enabled }}true{{ end }}
{{- end }}

{{/*
The dashboard's title in Grafana: the file's, with the release, since Grafana keys dashboards
by title within a folder too.
*/}}
{{- define "shardwise.dashboardTitle" -}}
{{- printf "%s (%s/%s)" (.Files.Get "dashboards/shardwise.json" | fromJson).title .Release.Namespace .Release.Name }}
{{- end }}

{{/*
The Argo CD balancer's names and labels. Its own app.kubernetes.io/name, so that no selector of
the controller (Service, PodDisruptionBudget, monitors, anti-affinity: name and instance) takes
its pods. Objects outside the release namespace (Argo CD's and the application namespaces) and
cluster-scoped ones also carry the release namespace, so that releases of the same name in two
namespaces do not collide there.
*/}}
{{- define "shardwise.balancer.fullname" -}}
{{- printf "%s-argocd-balancer" (include "shardwise.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "shardwise.balancer.foreignName" -}}
{{- printf "%s-%s-argocd-balancer" (include "shardwise.fullname" .) .Release.Namespace }}
{{- end }}

{{- define "shardwise.balancer.selectorLabels" -}}
app.kubernetes.io/name: {{ printf "%s-argocd-balancer" (include "shardwise.name" .) | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "shardwise.balancer.labels" -}}
helm.sh/chart: {{ include "shardwise.chart" . }}
{{ include "shardwise.balancer.selectorLabels" . }}
app.kubernetes.io/component: argocd-balancer
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/*
"true" when an application namespace is a pattern: the balancer then lists Applications in
every namespace and keeps the matching ones (as `is_literal` in the CLI decides), which needs a
ClusterRole.
*/}}
{{- define "shardwise.balancer.wildcard" -}}
{{- range .Values.argocdBalancer.applicationNamespaces }}
{{- if regexMatch "[*?]" . }}true{{ end }}
{{- end }}
{{- end }}
