{{/* The extender's listen address and whether it needs mutual TLS (any address but loopback). */}}
{{- define "gpupool.extenderHost" -}}{{ .Values.scheduler.extender.host | default "127.0.0.1" }}{{- end -}}
{{- define "gpupool.extenderTLS" -}}
{{- if not (has (include "gpupool.extenderHost" .) (list "127.0.0.1" "localhost" "::1")) -}}true{{- end -}}
{{- end -}}
{{- define "gpupool.extenderServerSecret" -}}{{ include "gpupool.fullname" . }}-extender-tls{{- end -}}
{{- define "gpupool.extenderClientSecret" -}}{{ include "gpupool.fullname" . }}-extender-client-tls{{- end -}}
{{/* Where the certificates are mounted: the extender's own pair (and the CA it trusts for clients), and
kube-scheduler's client pair (with the CA that signed the extender's certificate). */}}
{{- define "gpupool.extenderServerDir" -}}/etc/gpupool/extender-tls{{- end -}}
{{- define "gpupool.extenderClientDir" -}}/etc/gpupool/extender-client{{- end -}}
