{{/* Names and labels, as `helm create` lays them out. */}}

{{/* The release's name for its objects: fullnameOverride, else the release name when it
contains the chart name, else RELEASE-llmsim. At most 57 characters, so "-redis" fits a
DNS label. */}}
{{- define "llmsim.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 57 | trimSuffix "-" -}}
{{- else if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 57 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 57 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "llmsim.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "llmsim.commonLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: llmsim
{{- end -}}

{{- define "llmsim.labels" -}}
{{ include "llmsim.selectorLabels" . }}
app.kubernetes.io/component: server
{{ include "llmsim.commonLabels" . }}
{{- end -}}

{{- define "llmsim.redisSelectorLabels" -}}
{{ include "llmsim.selectorLabels" . }}
app.kubernetes.io/component: redis
{{- end -}}

{{- define "llmsim.redisLabels" -}}
{{ include "llmsim.redisSelectorLabels" . }}
{{ include "llmsim.commonLabels" . }}
{{- end -}}
