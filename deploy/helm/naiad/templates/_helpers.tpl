{{/* Names and labels shared by the templates. */}}

{{- define "naiad.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "naiad.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "naiad.selectorLabels" -}}
app.kubernetes.io/name: {{ include "naiad.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "naiad.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "naiad.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "naiad.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "naiad.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The --model-repository value for the chosen source (fails rendering on an incomplete choice). */}}
{{- define "naiad.modelRepository" -}}
{{- $repo := .Values.modelRepository }}
{{- if eq $repo.source "uri" }}
{{- required "modelRepository.uri is required when modelRepository.source=uri" $repo.uri }}
{{- else if eq $repo.source "volume" }}
{{- if not $repo.volume }}{{ fail "modelRepository.volume is required when modelRepository.source=volume" }}{{ end }}
{{- $repo.mountPath }}
{{- else if eq $repo.source "image" }}
{{- $repo.mountPath }}
{{- else }}
{{- fail (printf "modelRepository.source must be image, volume or uri (got %q)" $repo.source) }}
{{- end }}
{{- end }}
