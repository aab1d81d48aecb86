{{/* Names and labels shared by every object of the chart. */}}

{{- define "gpupool.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "gpupool.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Selector labels of one component: (dict "ctx" $ "component" "webhook") */}}
{{- define "gpupool.selector" -}}
app.kubernetes.io/name: {{ .ctx.Chart.Name }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "gpupool.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* kube-scheduler must match the cluster's minor version; managed clusters report e.g. v1.31.4-eks-1a2b. */}}
{{- define "gpupool.kubeSchedulerImage" -}}
{{- $tag := .Values.scheduler.kubeScheduler.image.tag -}}
{{- if not $tag -}}
{{- $tag = regexFind "^v[0-9]+\\.[0-9]+\\.[0-9]+" .Capabilities.KubeVersion.Version -}}
{{- end -}}
{{ .Values.scheduler.kubeScheduler.image.repository }}:{{ $tag }}
{{- end -}}

{{/* The agent DaemonSets, one per vendor of agent.vendors, as a JSON list; each entry:
  vendor     nvidia | amd | ascend
  component  the pods' component label and the DaemonSet's name suffix: agent for NVIDIA (the name and
             selector of the single DaemonSet of before, so an upgrade rolls it), agent-<vendor> otherwise
  backend    NVIDIA's is agent.backend (nvml, or fake on test clusters; with NVIDIA alone also amdsmi or dcmi,
             one backend for the whole release as before); AMD's amdsmi, Ascend's dcmi
  nvidia     what only NVIDIA nodes have: the RuntimeClass, the NVIDIA runtime's variables, the CUDA GPU
             servers of remote shares
  labelled   the DaemonSet and its pods carry gpupool.io/agent-vendor (not on the default, NVIDIA alone)
  nodeMatch  with several vendors, the node-affinity expression that picks this vendor's nodes */}}
{{- define "gpupool.agentVendors" -}}
{{- $vendors := .Values.agent.vendors | default (list "nvidia") -}}
{{- $several := gt (len $vendors) 1 -}}
{{- $nodes := .Values.agent.vendorNodes -}}
{{- /* NVIDIA's backend is agent.backend (nvml or fake); AMD's and Ascend's their own block's (the vendor
       library, or fake for testbeds and demos) */ -}}
{{- $backends := dict "nvidia" .Values.agent.backend "amd" (.Values.agent.amd.backend | default "amdsmi")
      "ascend" (.Values.agent.ascend.backend | default "dcmi") -}}
{{- $out := list -}}
{{- range $vendors -}}
{{- $nvidia := eq . "nvidia" -}}
{{- $entry := dict "vendor" . "component" (ternary "agent" (printf "agent-%s" .) $nvidia) "backend" (get $backends .)
      "nvidia" $nvidia "labelled" (or $several (not $nvidia)) -}}
{{- if $several -}}
{{- if eq $nodes.by "nfd" -}}
{{- $_ := set $entry "nodeMatch" (dict "key" (get $nodes.nfd .) "operator" "In" "values" (list "true")) -}}
{{- else if $nvidia -}}
{{- /* An NVIDIA node needs no label: every node the label gives another vendor is left out, so the nodes
       of a release that served NVIDIA alone keep their agent when other vendors join. */ -}}
{{- $_ := set $entry "nodeMatch" (dict "key" $nodes.label "operator" "NotIn" "values" (list "amd" "ascend")) -}}
{{- else -}}
{{- $_ := set $entry "nodeMatch" (dict "key" $nodes.label "operator" "In" "values" (list .)) -}}
{{- end -}}
{{- end -}}
{{- $out = append $out $entry -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{- define "gpupool.schedulerSA" -}}{{ include "gpupool.fullname" . }}-scheduler{{- end -}}
{{- define "gpupool.agentSA" -}}{{ include "gpupool.fullname" . }}-agent{{- end -}}
{{- define "gpupool.webhookSA" -}}{{ include "gpupool.fullname" . }}-webhook{{- end -}}
{{- define "gpupool.webhookService" -}}{{ include "gpupool.fullname" . }}-webhook{{- end -}}
{{- define "gpupool.webhookSecret" -}}{{ include "gpupool.fullname" . }}-webhook-tls{{- end -}}

{{/* "true" when gpupool places the claims of its DRA classes itself (the webhook gates pods with claims);
"" otherwise. dra.placement means nothing without dra.enabled. */}}
{{- define "gpupool.draPlacement" -}}
{{- if and .Values.dra.enabled .Values.dra.placement.enabled }}true{{ end -}}
{{- end -}}

{{/* The users whose writes of gpupool's own pod annotations are legitimate. */}}
{{- define "gpupool.trustedUsers" -}}
system:serviceaccount:{{ .Release.Namespace }}:{{ include "gpupool.schedulerSA" . }},system:serviceaccount:{{ .Release.Namespace }}:{{ include "gpupool.agentSA" . }}
{{- end -}}

{{/* Hardened container defaults (non-root unless a role says otherwise). */}}
{{- define "gpupool.containerSecurity" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
{{- end -}}

{{- define "gpupool.certMode" -}}
{{- $mode := .Values.webhook.certs.mode -}}
{{- if eq $mode "auto" -}}
{{- if .Capabilities.APIVersions.Has "cert-manager.io/v1" -}}certManager{{- else -}}helm{{- end -}}
{{- else -}}{{ $mode }}{{- end -}}
{{- end -}}

{{/* CEL (matchConditions): the pod asks for a gpupool resource in any container or init container. */}}
{{- define "gpupool.celAsksGpupool" -}}
{{- $c := "has(c.resources) && ((has(c.resources.limits) && c.resources.limits.exists(r, r.startsWith('gpupool.io/'))) || (has(c.resources.requests) && c.resources.requests.exists(r, r.startsWith('gpupool.io/'))))" -}}
object.spec.containers.exists(c, {{ $c }}) || (has(object.spec.initContainers) && object.spec.initContainers.exists(c, {{ $c }})) || (has(object.metadata.annotations) && object.metadata.annotations.exists(k, k.startsWith('gpupool.io/')))
{{- end -}}

{{/* CEL: an update changes one of the annotations only gpupool writes. */}}
{{- define "gpupool.celReservedChanged" -}}
['gpupool.io/allocation', 'gpupool.io/allocated'].exists(k, (has(object.metadata.annotations) && k in object.metadata.annotations ? object.metadata.annotations[k] : '') != (has(oldObject.metadata.annotations) && k in oldObject.metadata.annotations ? oldObject.metadata.annotations[k] : ''))
{{- end -}}

{{/* Where webhooks never apply: kube-system, the release namespace (the webhook must not gate its own
pods) and any namespaces the values add. */}}
{{- define "gpupool.webhookScope" -}}
namespaceSelector:
  matchExpressions:
    - key: kubernetes.io/metadata.name
      operator: NotIn
      values:
        {{- toYaml (concat (list "kube-system" .Release.Namespace) .Values.webhook.excludeNamespaces | uniq) | nindent 8 }}
{{- end -}}
