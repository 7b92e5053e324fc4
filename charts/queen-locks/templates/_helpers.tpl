{{- define "queen-locks.fullname" -}}
{{- if contains "queen-locks" .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-queen-locks" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "queen-locks.labels" -}}
app.kubernetes.io/name: queen-locks
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "queen-locks.selector" -}}
app.kubernetes.io/name: queen-locks
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "queen-locks.certSecret" -}}
{{ include "queen-locks.fullname" . }}-webhook-cert
{{- end -}}

{{- define "queen-locks.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/*
The guarded kinds as the manager's --guarded-resources takes them:
resource[.group]/version, comma-separated.
*/}}
{{- define "queen-locks.guardedResources" -}}
{{- $out := list -}}
{{- if .Values.guard.enabled -}}
{{- range .Values.guard.rules -}}
{{- $rule := . -}}
{{- range $rule.apiGroups -}}{{- $group := . -}}
{{- range $rule.apiVersions -}}{{- $version := . -}}
{{- range $rule.resources -}}
{{- $out = append $out (printf "%s%s/%s" . (ternary "" (printf ".%s" $group) (eq $group "")) $version) -}}
{{- end -}}{{- end -}}{{- end -}}{{- end -}}
{{- end -}}
{{- join "," (uniq $out) -}}
{{- end -}}
