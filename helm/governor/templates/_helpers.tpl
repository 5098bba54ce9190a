{{- define "governor.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "governor.fullname" -}}
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

{{- define "governor.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "governor.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* repository:tag, or repository@digest when a digest pins it: (list repository tag digest) */}}
{{- define "governor.imageRef" -}}
{{- $repo := index . 0 -}}{{- $tag := index . 1 -}}{{- $digest := index . 2 -}}
{{- if $digest -}}{{ $repo }}@{{ $digest }}{{- else -}}{{ $repo }}:{{ $tag }}{{- end -}}
{{- end -}}

{{- define "governor.selectorLabels" -}}
app.kubernetes.io/name: {{ include "governor.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "governor.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "governor.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "governor.passportConfigMap" -}}
{{- default (printf "%s-passport" (include "governor.fullname" .)) .Values.passport.existingConfigMap -}}
{{- end -}}

{{/* The governor container; placed in initContainers (native sidecar) or containers. */}}
{{- define "governor.container" -}}
- name: governor
  image: {{ include "governor.imageRef" (list .Values.governor.image.repository (.Values.governor.image.tag | default .Chart.AppVersion) .Values.governor.image.digest) | quote }}
  imagePullPolicy: {{ .Values.governor.image.pullPolicy }}
  {{- if .Values.governor.nativeSidecar }}
  restartPolicy: Always
  {{- end }}
  args:
    - run
    - --listen
    - "127.0.0.1:{{ .Values.governor.ports.proxy }}"
    - --control
    - "0.0.0.0:{{ .Values.governor.ports.control }}"
    {{- include "governor.runArgs" . | nindent 4 }}
    {{- if .Values.interception.enabled }}
    - --transparent
    - "127.0.0.1:{{ .Values.interception.transparentPort }}"
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
    # the names the control plane answers to besides the pod's own (its Host rule: DNS rebinding)
    {{- $control := printf "%s-control" (include "governor.fullname" .) }}
    - name: GOVERNOR_CONTROL_HOST
      value: "{{ $control }},{{ $control }}.{{ .Release.Namespace }},{{ $control }}.{{ .Release.Namespace }}.svc,{{ $control }}.{{ .Release.Namespace }}.svc.cluster.local"
    # SIGTERM: the drain, within the pod's grace period less 5 s kept for the records
    - name: GOVERNOR_DRAIN_TIMEOUT
      value: {{ sub (int .Values.terminationGracePeriodSeconds) 5 | quote }}
    {{- with include "governor.secretEnv" . | trim }}
    {{- . | nindent 4 }}
    {{- end }}
    {{- with .Values.governor.env }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- if not .Values.ca.existingSecret }}
  lifecycle:
    postStart:
      exec:
        # Hand the agent the CA certificate alone (the key stays in the data directory).
        # Python, not a shell: the image carries none.
        command:
          - python3
          - -c
          - |-
            import os, shutil, sys, time
            src = "{{ .Values.dataDir.mountPath }}/mitmproxy-ca-cert.pem"
            for _ in range(60):
                if os.path.isfile(src):
                    sys.exit(shutil.copy(src, "/var/run/governor-ca/") and 0)
                time.sleep(1)
            sys.exit(1)
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
    - name: tmp
      mountPath: /tmp
    {{- if .Values.ca.existingSecret }}
    - name: ca
      mountPath: "{{ .Values.dataDir.mountPath }}/mitmproxy-ca.pem"
      subPath: mitmproxy-ca.pem
      readOnly: true
    {{- else }}
    - name: agent-ca
      mountPath: /var/run/governor-ca
    {{- end }}
{{- end -}}


{{/* Interception needs the governor's user id (the rules exempt it) and another one for the agent. */}}
{{- define "governor.checkInterception" -}}
{{- if .Values.interception.enabled -}}
{{- $gov := .Values.governor.securityContext.runAsUser -}}
{{- if not $gov -}}
{{- fail "interception.enabled needs governor.securityContext.runAsUser: the iptables rules exempt that user" -}}
{{- end -}}
{{- if eq (toString $gov) (toString (default "" .Values.agent.securityContext.runAsUser)) -}}
{{- fail "interception.enabled: agent.securityContext.runAsUser must differ from the governor's, or the agent is exempt too" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The init container that installs the interception rules (files/intercept.sh), then exits. */}}
{{- define "governor.interceptContainer" -}}
- name: intercept
  image: {{ include "governor.imageRef" (list (.Values.interception.image.repository | default (printf "%s-intercept" .Values.governor.image.repository)) (.Values.interception.image.tag | default (.Values.governor.image.tag | default .Chart.AppVersion)) .Values.interception.image.digest) | quote }}
  imagePullPolicy: {{ .Values.governor.image.pullPolicy }}
  command: [sh, /etc/governor/intercept/intercept.sh]
  env:
    - name: GOVERNOR_UID
      value: {{ .Values.governor.securityContext.runAsUser | quote }}
    - name: TRANSPARENT_PORT
      value: {{ .Values.interception.transparentPort | quote }}
    - name: INTERCEPT_PORTS
      value: {{ join "," .Values.interception.ports | quote }}
    - name: ALLOW_DNS
      value: {{ ternary "1" "0" .Values.interception.allowDNS | quote }}
    - name: DNS_SERVERS
      value: {{ join "," .Values.interception.dnsServers | quote }}
    - name: IPTABLES
      value: {{ .Values.interception.iptables | quote }}
    - name: IP6TABLES
      value: {{ printf "%s" .Values.interception.iptables | replace "iptables" "ip6tables" | quote }}
  resources:
    {{- toYaml .Values.interception.resources | nindent 4 }}
  # Outside the "restricted" profile by necessity: root with NET_ADMIN/NET_RAW to write
  # the pod's iptables rules. It exits before the agent starts.
  securityContext:
    runAsUser: 0
    runAsNonRoot: false
    allowPrivilegeEscalation: false
    readOnlyRootFilesystem: true
    capabilities:
      drop: [ALL]
      add: [NET_ADMIN, NET_RAW]
    seccompProfile: {type: RuntimeDefault}
  volumeMounts:
    - name: intercept-script
      mountPath: /etc/governor/intercept
      readOnly: true
    - name: intercept-run
      mountPath: /run
{{- end -}}

{{/* `governor run`'s policy arguments, the same in both modes (a gateway has no default session:
its agents are many, and token-less traffic would share one session per replica). */}}
{{- define "governor.runArgs" -}}
- --passport
- "/etc/governor/passport/{{ .Values.passport.key }}"
- --data-dir
- {{ .Values.dataDir.mountPath | quote }}
- --tier
- {{ .Values.governor.tier | quote }}
- --sessions
- {{ .Values.sessions.mode | quote }}
- --default-session
- {{ ternary "off" .Values.sessions.defaultSession (eq .Values.mode "gateway") | quote }}
- --agent-sessions-per-day
- {{ .Values.sessions.agentSessionsPerDay | quote }}
- --lock-on
- {{ .Values.sessions.lockOn | quote }}
- --fit-output
- {{ .Values.governor.fitOutput | quote }}
- --fit-floor
- {{ .Values.governor.fitFloor | quote }}
- --review-hold-seconds
- {{ .Values.governor.reviewHoldSeconds | quote }}
- --review-retry-after
- {{ .Values.governor.reviewRetryAfter | quote }}
{{- end -}}

{{/* The tokens and webhook settings from Secrets, the same in both modes. */}}
{{- define "governor.secretEnv" -}}
{{- if .Values.reviewerTokens.existingSecret }}
- name: GOVERNOR_REVIEWER_TOKENS
  valueFrom:
    secretKeyRef:
      name: {{ .Values.reviewerTokens.existingSecret }}
      key: {{ .Values.reviewerTokens.key }}
{{- end }}
{{- if .Values.controlToken.existingSecret }}
- name: GOVERNOR_CONTROL_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ .Values.controlToken.existingSecret }}
      key: {{ .Values.controlToken.key }}
{{- end }}
{{- if .Values.webhooks.urls }}
- name: GOVERNOR_WEBHOOKS
  value: {{ join "," .Values.webhooks.urls | quote }}
- name: GOVERNOR_WEBHOOK_SECRET
  valueFrom:
    secretKeyRef:
      name: {{ required "webhooks.secret.existingSecret: the webhooks' signing secret is required with webhooks.urls" .Values.webhooks.secret.existingSecret }}
      key: {{ .Values.webhooks.secret.key }}
{{- end }}
{{- end -}}
