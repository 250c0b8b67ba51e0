{{/* Chart name, overridable with nameOverride. */}}
{{- define "llm-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
Full name of every object: fullnameOverride, else the release name when it already contains the
chart name, else <release>-<chart>. Truncated to 63 characters (DNS label).
*/}}
{{- define "llm-operator.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "llm-operator.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "llm-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
Selector labels: stable for the life of a release (Deployment selectors are immutable). The
operator stamps app.kubernetes.io/name=llm-operator on its serving pods too, with the LLMDeployment
as instance; component=operator keeps the metrics Service off them whatever the names.
*/}}
{{- define "llm-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "llm-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "llm-operator.labels" -}}
{{ include "llm-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: llm-operator
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ include "llm-operator.chart" . }}
{{- end -}}

{{- define "llm-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "llm-operator.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* One of the project's other images (dict "root" $ "name" "cpu-runtime" "value" <the value>):
the value when set, else <image.repository's directory>/<name>@<image.digests[name]> when a release
pinned it, else <image.repository's directory>/<name>:<appVersion>, where `make images` and the
release workflow push it (ghcr.io/llm-operator/llm-operator/cpu-runtime:<appVersion> by default). */}}
{{- define "llm-operator.ownImage" -}}
{{- $digest := get (.root.Values.image.digests | default dict) .name -}}
{{- $default := printf "%s/%s:%s" (dir .root.Values.image.repository) .name .root.Chart.AppVersion -}}
{{- if $digest -}}{{- $default = printf "%s/%s@%s" (dir .root.Values.image.repository) .name $digest -}}{{- end -}}
{{- .value | default $default -}}
{{- end -}}

{{/* repository@digest when a digest is given, else repository:tag (tag defaults to appVersion). */}}
{{- define "llm-operator.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}
{{- end -}}
