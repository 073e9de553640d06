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
