{{/* mode: gateway (docs/deployment.md#gateway): the checks that refuse a gateway that could not
share one governor's state, the store URL with its password from a Secret, and the container. */}}

{{- define "governor.isGateway" -}}
{{- if eq (toString .Values.mode) "gateway" -}}true{{- end -}}
{{- end -}}

{{- define "governor.checkGateway" -}}
{{- $g := .Values.gateway -}}
{{- if lt (int $g.replicas) 1 -}}
{{- fail (printf "gateway.replicas must be 1 or more, got %v" $g.replicas) -}}
{{- end -}}
{{- $url := toString $g.store.url -}}
{{- if not $url -}}
{{- fail "mode gateway needs gateway.store.url: the replicas share sessions and budgets through a Redis store (redis://, rediss://, redis+sentinel:// or redis+cluster://; docs/reference/stores.md)" -}}
{{- end -}}
{{- if not (regexMatch "^rediss?(\\+sentinel|\\+cluster)?://" $url) -}}
{{- fail (printf "gateway.store.url must be a Redis store (redis://, rediss://, redis+sentinel:// or redis+cluster://), got %q: an embedded store (a path, sqlite://, memory:) is one process's, and the replicas would not share sessions or budgets" (regexReplaceAll ":[^:@/]*@" $url ":***@")) -}}
{{- end -}}
{{- $authority := regexReplaceAll "^[a-z+]+://" $url "" | regexFind "^[^/?]*" -}}
{{- if regexMatch "^[^@]*:[^@]*@" $authority -}}
{{- fail "gateway.store.url carries a password inline: put it in a Secret and name it in gateway.store.password.existingSecret (the URL keeps HOST:PORT and, if any, the username)" -}}
{{- end -}}
{{- if regexMatch "[?&]sentinel_password=" $url -}}
{{- fail "gateway.store.url carries sentinel_password inline: name a Secret in gateway.store.sentinelPassword.existingSecret instead" -}}
{{- end -}}
{{- if regexMatch "[?&]sessions=local" $url -}}
{{- fail "gateway.store.url has sessions=local: the replicas of a gateway share their sessions through the store (leave sessions at its default, shared)" -}}
{{- end -}}
{{- if and $g.store.sentinelPassword.existingSecret (not (hasPrefix "redis+sentinel://" $url)) (not (hasPrefix "rediss+sentinel://" $url)) -}}
{{- fail "gateway.store.sentinelPassword is for a redis+sentinel:// store URL" -}}
{{- end -}}
{{- if not .Values.ca.existingSecret -}}
{{- fail "mode gateway needs ca.existingSecret: every replica must present the one CA the agents trust (a Secret with mitmproxy-ca.pem and mitmproxy-ca-cert.pem; docs/deployment.md#gateway)" -}}
{{- end -}}
{{- if not $g.key.existingSecret -}}
{{- fail "mode gateway needs gateway.key.existingSecret: the replicas are one governor and sign records with one key (a Secret of the files `governor keygen --out DIR` writes)" -}}
{{- end -}}
{{- if not .Values.controlToken.existingSecret -}}
{{- fail "mode gateway needs controlToken.existingSecret: one control token for every replica (a generated one would differ per pod)" -}}
{{- end -}}
{{- if not .Values.reviewerTokens.existingSecret -}}
{{- fail "mode gateway needs reviewerTokens.existingSecret: a reviewer answers through any replica (a generated token would differ per pod)" -}}
{{- end -}}
{{- if .Values.dataDir.persistence.enabled -}}
{{- fail "mode gateway keeps no state in its pods (it is in the Redis store): dataDir.persistence.enabled is for the sidecar" -}}
{{- end -}}
{{- $records := $g.records.persistence -}}
{{- if and $records.enabled (not $records.existingClaim) -}}
{{- fail "gateway.records.persistence.enabled needs gateway.records.persistence.existingClaim: an existing ReadWriteMany PersistentVolumeClaim that every replica mounts (each pod writes its own subdirectory)" -}}
{{- end -}}
{{- if .Values.interception.enabled -}}
{{- fail "interception.enabled is for the sidecar (it redirects the agent's traffic inside its pod); a gateway's agents are in other pods" -}}
{{- end -}}
{{- if le (int .Values.terminationGracePeriodSeconds) (add (int $g.preStopSeconds) 5) -}}
{{- fail (printf "terminationGracePeriodSeconds (%v) must exceed gateway.preStopSeconds (%v) + 5: the drain needs time of its own" .Values.terminationGracePeriodSeconds $g.preStopSeconds) -}}
{{- end -}}
{{- end -}}

{{/* The store URL with $(VARIABLE) references Kubernetes fills from the Secrets' env entries. */}}
{{- define "governor.gatewayStoreUrl" -}}
{{- $g := .Values.gateway -}}
{{- $url := toString $g.store.url -}}
{{- if $g.store.password.existingSecret -}}
{{- $scheme := regexFind "^[a-z+]+://" $url -}}
{{- $rest := trimPrefix $scheme $url -}}
{{- $authority := regexFind "^[^/?]*" $rest -}}
{{- if contains "@" $authority -}}
{{- $user := regexFind "^[^@]*" $rest -}}
{{- $url = printf "%s%s:$(GOVERNOR_STORE_PASSWORD)@%s" $scheme $user (trimPrefix (printf "%s@" $user) $rest) -}}
{{- else -}}
{{- $url = printf "%s:$(GOVERNOR_STORE_PASSWORD)@%s" $scheme $rest -}}
{{- end -}}
{{- end -}}
{{- if $g.store.sentinelPassword.existingSecret -}}
{{- $url = printf "%s%ssentinel_password=$(GOVERNOR_SENTINEL_PASSWORD)" $url (ternary "&" "?" (contains "?" $url)) -}}
{{- end -}}
{{- $url -}}
{{- end -}}

{{/* The gateway's governor container: listens on the pod IP for agents in other pods. */}}
{{- define "governor.gatewayContainer" -}}
- name: governor
  image: {{ include "governor.imageRef" (list .Values.governor.image.repository (.Values.governor.image.tag | default .Chart.AppVersion) .Values.governor.image.digest) | quote }}
  imagePullPolicy: {{ .Values.governor.image.pullPolicy }}
  args:
    - run
    - --listen
    - "0.0.0.0:{{ .Values.governor.ports.proxy }}"
    - --control
    - "0.0.0.0:{{ .Values.governor.ports.control }}"
    {{- include "governor.runArgs" . | nindent 4 }}
    {{- if gt (int .Values.gateway.workers) 1 }}
    - --workers
    - {{ .Values.gateway.workers | quote }}
    {{- end }}
    {{- range .Values.governor.extraArgs }}
    - {{ . | quote }}
    {{- end }}
  ports:
    - name: proxy
      containerPort: {{ .Values.governor.ports.proxy }}
    - name: control
      containerPort: {{ .Values.governor.ports.control }}
  env:
    {{- $control := printf "%s-control" (include "governor.fullname" .) }}
    - name: GOVERNOR_CONTROL_HOST
      value: "{{ $control }},{{ $control }}.{{ .Release.Namespace }},{{ $control }}.{{ .Release.Namespace }}.svc,{{ $control }}.{{ .Release.Namespace }}.svc.cluster.local"
    # SIGTERM: the drain, within the grace period less the preStop wait and 5 s kept for the records
    - name: GOVERNOR_DRAIN_TIMEOUT
      value: {{ sub (sub (int .Values.terminationGracePeriodSeconds) (int .Values.gateway.preStopSeconds)) 5 | quote }}
    {{- if .Values.gateway.store.password.existingSecret }}
    - name: GOVERNOR_STORE_PASSWORD
      valueFrom:
        secretKeyRef:
          name: {{ .Values.gateway.store.password.existingSecret }}
          key: {{ .Values.gateway.store.password.key }}
    {{- end }}
    {{- if .Values.gateway.store.sentinelPassword.existingSecret }}
    - name: GOVERNOR_SENTINEL_PASSWORD
      valueFrom:
        secretKeyRef:
          name: {{ .Values.gateway.store.sentinelPassword.existingSecret }}
          key: {{ .Values.gateway.store.sentinelPassword.key }}
    {{- end }}
    # Each replica keeps its own transparency log (its data directory is its own): one origin
    # per pod, or two logs under one origin and key would fork each other's checkpoints.
    - name: GOVERNOR_POD_NAME
      valueFrom:
        fieldRef:
          fieldPath: metadata.name
    - name: GOVERNOR_LOG_ORIGIN
      value: "{{ include "governor.fullname" . }}.{{ .Release.Namespace }}/log/$(GOVERNOR_POD_NAME)"
    # after the passwords: Kubernetes fills $(NAME) from the entries above
    - name: GOVERNOR_STORE
      value: {{ include "governor.gatewayStoreUrl" . | quote }}
    {{- with include "governor.secretEnv" . | trim }}
    {{- . | nindent 4 }}
    {{- end }}
    {{- with .Values.governor.env }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- if .Values.gateway.preStopSeconds }}
  lifecycle:
    preStop:
      exec:
        # keep serving while the Service's endpoints forget this pod; then SIGTERM drains
        command: [python3, -c, "import time; time.sleep({{ .Values.gateway.preStopSeconds }})"]
  {{- end }}
  startupProbe:
    httpGet: {path: /healthz, port: control}
    {{- toYaml .Values.probes.startup | nindent 4 }}
  livenessProbe:
    httpGet: {path: /healthz, port: control}
    {{- toYaml .Values.probes.liveness | nindent 4 }}
  readinessProbe:
    httpGet: {path: /readyz, port: control}
    {{- toYaml .Values.probes.readiness | nindent 4 }}
  resources:
    {{- toYaml .Values.governor.resources | nindent 4 }}
  securityContext:
    {{- toYaml .Values.governor.securityContext | nindent 4 }}
  volumeMounts:
    - name: passport
      mountPath: /etc/governor/passport
      readOnly: true
    - name: data
      mountPath: {{ .Values.dataDir.mountPath }}
      {{- if .Values.gateway.records.persistence.enabled }}
      # this pod's own directory on the shared claim: its records, log and journals outlive it
      subPathExpr: $(GOVERNOR_POD_NAME)
      {{- end }}
    - name: tmp
      mountPath: /tmp
    - name: ca
      mountPath: "{{ .Values.dataDir.mountPath }}/mitmproxy-ca.pem"
      subPath: mitmproxy-ca.pem
      readOnly: true
    - name: governor-key
      mountPath: "{{ .Values.dataDir.mountPath }}/keys"
      readOnly: true
{{- end -}}
