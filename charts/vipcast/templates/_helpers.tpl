{{/* Chart name. */}}
{{- define "vipcast.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Full name prefix: <release>-<chart>, or the release name when it already contains the chart name. */}}
{{- define "vipcast.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "vipcast.ccm.fullname" -}}
{{- printf "%s-ccm" (include "vipcast.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "vipcast.speaker.fullname" -}}
{{- printf "%s-speaker" (include "vipcast.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels on every object. */}}
{{- define "vipcast.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "vipcast.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Selector labels of one component: pass (dict "ctx" $ "component" "ccm"). */}}
{{- define "vipcast.selectorLabels" -}}
app.kubernetes.io/name: {{ include "vipcast.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "vipcast.componentLabels" -}}
{{ include "vipcast.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Image reference: pass (dict "ctx" $ "image" .Values.ccm.image). */}}
{{- define "vipcast.image" -}}
{{- printf "%s:%s" .image.repository (default .ctx.Chart.AppVersion .image.tag) -}}
{{- end -}}

{{/*
The convergence delay in whole seconds, rounded up. The schema allows only
"<n>ms", "<n>s" or "<n>m", so this needs no duration parser.
*/}}
{{- define "vipcast.speaker.delaySeconds" -}}
{{- $d := .Values.speaker.convergenceDelay -}}
{{- if hasSuffix "ms" $d -}}
{{- div (add (trimSuffix "ms" $d | atoi) 999) 1000 -}}
{{- else if hasSuffix "m" $d -}}
{{- mul (trimSuffix "m" $d | atoi) 60 -}}
{{- else -}}
{{- trimSuffix "s" $d | atoi -}}
{{- end -}}
{{- end -}}

{{/* terminationGracePeriodSeconds of the speaker: explicit (checked) or delay + 35. */}}
{{- define "vipcast.speaker.gracePeriod" -}}
{{- $delay := include "vipcast.speaker.delaySeconds" . | atoi -}}
{{- $grace := .Values.speaker.terminationGracePeriodSeconds -}}
{{- if $grace -}}
{{- if le (int $grace) (add $delay 5) -}}
{{- fail (printf "speaker.terminationGracePeriodSeconds=%v is too short for speaker.convergenceDelay=%s: the kubelet would kill the speaker before it closes its BGP sessions; use at least %d, or leave it empty" $grace .Values.speaker.convergenceDelay (add $delay 6)) -}}
{{- end -}}
{{- int $grace -}}
{{- else -}}
{{- add $delay 35 -}}
{{- end -}}
{{- end -}}

{{- /* The name of the Secret of the connection sync relay's keys, empty
when the relay is off (no two tiers, another transport, or sync off). */ -}}
{{- define "vipcast.speaker.connSyncKeys" -}}
{{- $c := .Values.speaker.ipvs.connSync -}}
{{- if and .Values.speaker.ipvs.enabled .Values.speaker.ipvs.tunnelPrefix (eq $c.transport "relay") (ne $c.interface "none") -}}
{{- default (printf "%s-conn-sync-keys" (include "vipcast.speaker.fullname" .)) $c.keySecret -}}
{{- end -}}
{{- end -}}

{{/*
The Secrets the speaker may read (speaker.bgpPasswordSecrets.secrets, each
"namespace/name"), as a JSON object: namespace → sorted names. A Secret of
the release namespace is refused: that namespace holds Helm's release
Secrets, and the password Secrets belong in a namespace of their own.
*/}}
{{- define "vipcast.speaker.passwordSecrets" -}}
{{- $byNS := dict -}}
{{- range $s := .Values.speaker.bgpPasswordSecrets.secrets | default list -}}
{{- $parts := splitList "/" $s -}}
{{- if ne (len $parts) 2 -}}
{{- fail (printf "speaker.bgpPasswordSecrets.secrets: %q is not namespace/name: name each Secret with its namespace, such as vipcast-bgp-passwords/tor-a-md5" $s) -}}
{{- end -}}
{{- $ns := index $parts 0 -}}
{{- if eq $ns $.Release.Namespace -}}
{{- fail (printf "speaker.bgpPasswordSecrets.secrets names %s, in the release namespace %q: that namespace holds Helm's release Secrets (sh.helm.release.v1.*, the whole rendered release); keep the BGP password Secrets in a namespace of their own, such as vipcast-bgp-passwords" $s $.Release.Namespace) -}}
{{- end -}}
{{- $_ := set $byNS $ns (append (get $byNS $ns | default list) (index $parts 1) | sortAlpha) -}}
{{- end -}}
{{- toJson $byNS -}}
{{- end -}}

{{/*
The CCM's Lease name: ccm.leaderElection.resourceName, or the binary's own
default derived from loadBalancerClass (lbclass.Selector.LeaseName).
*/}}
{{- define "vipcast.ccm.leaseName" -}}
{{- if .Values.ccm.leaderElection.resourceName -}}
{{- .Values.ccm.leaderElection.resourceName -}}
{{- else if .Values.loadBalancerClass -}}
{{- printf "vipcast-ccm-%s" (.Values.loadBalancerClass | replace "/" "-" | replace "_" "-" | lower) -}}
{{- else -}}
vipcast-ccm
{{- end -}}
{{- end -}}

{{/*
Which Services vipcast serves: the same flags for the CCM and the speakers.
*/}}
{{- define "vipcast.classArgs" -}}
{{- with .Values.loadBalancerClass }}
- --load-balancer-class={{ . }}
{{- end }}
{{- if kindIs "bool" .Values.serveClasslessServices }}
- --serve-classless-services={{ .Values.serveClasslessServices }}
{{- end }}
{{- end -}}
