{{- define "torpor.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{- define "torpor.labels" -}}
app.kubernetes.io/part-of: torpor
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end }}

{{- define "torpor.agentUser" -}}
system:serviceaccount:{{ .Release.Namespace }}:torpor-agent
{{- end }}

{{/* The port of an address "host:port" ("[::1]:9464" too). */}}
{{- define "torpor.port" -}}
{{ splitList ":" . | last }}
{{- end }}

{{/* "true" when an address "host:port" is on the loopback. */}}
{{- define "torpor.loopback" -}}
{{- $host := trimSuffix (printf ":%s" (include "torpor.port" .)) . -}}
{{- if or (hasPrefix "127." $host) (eq $host "localhost") (eq $host "[::1]") -}}true{{- end -}}
{{- end }}

{{/* The metrics endpoints of the torpor-node pod: name, port served to Prometheus, upstream address. */}}
{{- define "torpor.metricsEndpoints" -}}
{{- $m := .Values.metrics -}}
{{- if $m.address }}
- { name: metrics, port: {{ if $m.rbacProxy.enabled }}{{ $m.rbacProxy.port }}{{ else }}{{ include "torpor.port" $m.address }}{{ end }}, upstream: {{ $m.address | quote }} }
{{- end }}
{{- if .Values.agent.metricsAddress }}
- { name: agent-metrics, port: {{ if $m.rbacProxy.enabled }}{{ $m.rbacProxy.agentPort }}{{ else }}{{ include "torpor.port" .Values.agent.metricsAddress }}{{ end }}, upstream: {{ .Values.agent.metricsAddress | quote }} }
{{- end }}
{{- end }}
