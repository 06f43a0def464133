{{- define "sonde.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "sonde.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "sonde.labels" -}}
{{ include "sonde.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "sonde.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "sonde.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "sonde.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* sonde.yaml: each key is one of sonde's flags. */}}
{{- define "sonde.config" -}}
{{- $c := dict "frequency" .Values.frequency "interval" .Values.interval "metrics-addr" (printf ":%v" .Values.metricsPort) "log-level" .Values.logLevel "top" 0 "cgroup-root" "/host/sys/fs/cgroup" "k8s-metadata" .Values.kubernetesMetadata -}}
{{- with .Values.otlp.endpoint }}{{ $_ := set $c "otlp-endpoint" . }}{{ end -}}
{{- if .Values.otlp.insecure }}{{ $_ := set $c "otlp-insecure" true }}{{ end -}}
{{- with .Values.filters.namespaces }}{{ $_ := set $c "k8s-namespaces" (join "," .) }}{{ end -}}
{{- with .Values.filters.podSelector }}{{ $_ := set $c "k8s-pod-selector" . }}{{ end -}}
{{- if .Values.debuginfod.urls }}{{ $_ := set $c "debuginfod-cache-size" .Values.debuginfod.cacheSize }}{{ end -}}
{{- toYaml (merge (deepCopy .Values.config) $c) -}}
{{- end -}}
