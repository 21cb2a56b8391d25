{{/* The release's full name: the release name, with the chart's name unless it already holds it. */}}
{{- define "student-bridge.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "student-bridge.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "student-bridge.labels" -}}
{{ include "student-bridge.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "student-bridge.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "student-bridge.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name: set it when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "student-bridge.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* watch.labelSelector as the label selector string the bridge's labelSelector key takes. */}}
{{- define "student-bridge.labelSelector" -}}
{{- $parts := list -}}
{{- range $k, $v := .Values.watch.labelSelector.matchLabels -}}
{{- $parts = append $parts (printf "%s=%s" $k $v) -}}
{{- end -}}
{{- range .Values.watch.labelSelector.matchExpressions -}}
{{- if eq .operator "In" -}}
{{- $parts = append $parts (printf "%s in (%s)" .key (join "," .values)) -}}
{{- else if eq .operator "NotIn" -}}
{{- $parts = append $parts (printf "%s notin (%s)" .key (join "," .values)) -}}
{{- else if eq .operator "Exists" -}}
{{- $parts = append $parts .key -}}
{{- else -}}
{{- $parts = append $parts (printf "!%s" .key) -}}
{{- end -}}
{{- end -}}
{{- join "," $parts -}}
{{- end -}}

{{/* The Secret key holding the NATS credential, and the file name and config key it becomes. */}}
{{- define "student-bridge.natsCredential" -}}
{{- $a := .Values.natsAuth -}}
{{- $set := list -}}
{{- if $a.passwordKey }}{{ $set = append $set (dict "key" $a.passwordKey "file" "password" "config" "passwordFile") }}{{ end -}}
{{- if $a.tokenKey }}{{ $set = append $set (dict "key" $a.tokenKey "file" "token" "config" "tokenFile") }}{{ end -}}
{{- if $a.nkeySeedKey }}{{ $set = append $set (dict "key" $a.nkeySeedKey "file" "nkey.seed" "config" "nkeySeedFile") }}{{ end -}}
{{- if $a.credsKey }}{{ $set = append $set (dict "key" $a.credsKey "file" "user.creds" "config" "credsFile") }}{{ end -}}
{{- if and $a.secretName (ne (len $set) 1) -}}
{{- fail "natsAuth: set exactly one of passwordKey, tokenKey, nkeySeedKey and credsKey with secretName" -}}
{{- end -}}
{{- if $a.secretName }}{{ first $set | toJson }}{{ else }}{}{{ end -}}
{{- end -}}

{{/* The bridge's configuration file: values.config with the keys the chart owns. */}}
{{- define "student-bridge.config" -}}
{{- $auth := dict -}}
{{- $cred := include "student-bridge.natsCredential" . | fromJson -}}
{{- if $cred.file -}}
{{- $_ := set $auth $cred.config (printf "/etc/student-bridge/nats/%s" $cred.file) -}}
{{- if and .Values.natsAuth.user (ne $cred.config "credsFile") (ne $cred.config "nkeySeedFile") -}}
{{- $_ := set $auth "user" .Values.natsAuth.user -}}
{{- end -}}
{{- end -}}
{{- $tls := dict -}}
{{- with .Values.natsTLS -}}
{{- if .secretName -}}
{{- if .caKey }}{{ $_ := set $tls "caFile" "/etc/student-bridge/nats-tls/ca.crt" }}{{ end -}}
{{- if and .certKey .keyKey -}}
{{- $_ := set $tls "certFile" "/etc/student-bridge/nats-tls/tls.crt" -}}
{{- $_ := set $tls "keyFile" "/etc/student-bridge/nats-tls/tls.key" -}}
{{- else if or .certKey .keyKey -}}
{{- fail "natsTLS: set both certKey and keyKey, or neither" -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $owned := dict "metricsAddr" ":8080" "healthAddr" ":8081" "namespaces" .Values.watch.namespaces "labelSelector" (include "student-bridge.labelSelector" .) -}}
{{- $nats := dict -}}
{{- if $auth }}{{ $_ := set $nats "auth" $auth }}{{ end -}}
{{- if $tls }}{{ $_ := set $nats "tls" $tls }}{{ end -}}
{{- if $nats }}{{ $_ := set $owned "nats" $nats }}{{ end -}}
{{- $cfg := mergeOverwrite (deepCopy (default dict .Values.config)) $owned -}}
{{- toYaml $cfg -}}
{{- end -}}

{{/* Whether the bridge holds deletes with its finalizer (config.deletes.holdWithFinalizer, default true). */}}
{{- define "student-bridge.holdsDeletes" -}}
{{- $d := dig "deletes" "holdWithFinalizer" true (default dict .Values.config) -}}
{{- if $d }}true{{ end -}}
{{- end -}}

{{- define "student-bridge.leaseNamespace" -}}
{{- dig "leaderElection" "namespace" "" (default dict .Values.config) | default .Release.Namespace -}}
{{- end -}}

{{/* The restricted Pod Security profile, for the bridge and its hook. */}}
{{- define "student-bridge.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "student-bridge.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop:
  - ALL
{{- end -}}
