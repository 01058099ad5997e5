{{/*
The driver's name: the DRA driver name and the kubelet plugin directory.
Fixed by the binaries; not a value.
*/}}
{{- define "kyb.driverName" -}}gpu.kyb.ai{{- end }}

{{- define "kyb.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kyb.fullname" -}}
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

{{/* component: what the DaemonSet runs. */}}
{{- define "kyb.component" -}}
{{- if eq .Values.mode "dra" }}kubelet-plugin{{ else }}device-plugin{{ end }}
{{- end }}

{{- define "kyb.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
An identifier of this release that is unique in the cluster (namespace and
name), short enough for a label value.
*/}}
{{- define "kyb.instanceID" -}}
{{- printf "%s/%s" .Release.Namespace .Release.Name | sha256sum | trunc 16 }}
{{- end }}

{{- define "kyb.labels" -}}
helm.sh/chart: {{ include "kyb.chart" . }}
{{ include "kyb.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: kyb-dra-driver
{{- end }}

{{- define "kyb.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kyb.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Selector of the DaemonSet's pods; immutable, so it names the component. */}}
{{- define "kyb.podSelectorLabels" -}}
{{ include "kyb.selectorLabels" . }}
app.kubernetes.io/component: {{ include "kyb.component" . }}
{{- end }}

{{- define "kyb.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "kyb.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "kyb.serviceAccountUser" -}}
system:serviceaccount:{{ .Release.Namespace }}:{{ include "kyb.serviceAccountName" . }}
{{- end }}

{{- define "kyb.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/*
The profiles the DeviceClasses are made for: the configured ones, or the
driver's defaults (1x, 2x, 4x; pkg/planner DefaultSizes) when none is
configured. Each becomes {resource, name}: name is the value of the device
attribute "profile", defaulted as v1alpha1.DefaultProfileName does (the
resource's name without "gpu-" and "-seat", lower case).
Returns a YAML list.
*/}}
{{- define "kyb.profiles" -}}
{{- $profiles := .Values.nodeConfig.profiles }}
{{- if not $profiles }}
{{- $profiles = list (dict "resource" "kyb.ai/gpu-1x-seat") (dict "resource" "kyb.ai/gpu-2x-seat") (dict "resource" "kyb.ai/gpu-4x-seat") }}
{{- end }}
{{- $out := list }}
{{- range $profiles }}
{{- $base := .resource | splitList "/" | last }}
{{- $name := .name | default ($base | trimPrefix "gpu-" | trimSuffix "-seat" | lower) }}
{{- /* A MIG profile's resource is named as nvidia-smi names the MIG profile (mig-1g.10gb); its default name is a DNS label (mig-1g-10gb). */}}
{{- if and .mig (not .name) }}{{ $name = regexReplaceAll "[^a-z0-9-]+" $name "-" | trimAll "-" }}{{ end }}
{{- $out = append $out (dict "resource" .resource "name" $name) }}
{{- end }}
{{- toYaml $out }}
{{- end }}

{{/*
"true" where a profile of nodeConfig uses MIG (has mig): the plugin then
makes and destroys MIG instances, which needs the MIG config capability
(README "Security context").
*/}}
{{- define "kyb.usesMIG" -}}
{{- $mig := false }}
{{- range .Values.nodeConfig.profiles }}{{ if .mig }}{{ $mig = true }}{{ end }}{{ end }}
{{- $mig }}
{{- end }}

{{/*
The DeviceClass of a resource, as draresources.DeviceClassName names it:
kyb.ai/gpu-1x-seat -> gpu-1x-seat.kyb.ai.
*/}}
{{- define "kyb.deviceClassName" -}}
{{- $parts := regexSplit "/" . 2 }}
{{- printf "%s.%s" (index $parts 1) (index $parts 0) }}
{{- end }}

{{/*
The NodeConfig document: only the fields the user set, so that the driver's
defaults stay the driver's (an empty profiles list would be an error).
*/}}
{{- define "kyb.nodeConfig" -}}
{{- $c := dict "apiVersion" "kyb.ai/v1alpha1" "kind" "NodeConfig" }}
{{- with .Values.nodeConfig }}
{{- if .profiles }}{{ $_ := set $c "profiles" .profiles }}{{ end }}
{{- if .groups }}{{ $_ := set $c "groups" .groups }}{{ end }}
{{- if .grouping }}{{ $_ := set $c "grouping" .grouping }}{{ end }}
{{- if .allocationPolicy }}{{ $_ := set $c "allocationPolicy" .allocationPolicy }}{{ end }}
{{- if .unavailableGroups }}{{ $_ := set $c "unavailableGroups" .unavailableGroups }}{{ end }}
{{- if .attributes }}{{ $_ := set $c "attributes" .attributes }}{{ end }}
{{- if .health }}{{ $_ := set $c "health" .health }}{{ end }}
{{- end }}
{{- toYaml $c }}
{{- end }}

{{/*
The kubelet's device-plugin directory. Fixed in the kubelet
(k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1 DevicePluginPath): its
device manager listens there whatever its root directory, so it does not
follow kubeletRootDir.
*/}}
{{- define "kyb.devicePluginDir" -}}/var/lib/kubelet/device-plugins{{- end }}

{{/* Where the plugin keeps its sockets and checkpoint on the host. */}}
{{- define "kyb.pluginDataDir" -}}
{{- printf "%s/plugins/%s" (trimSuffix "/" .Values.kubeletRootDir) (include "kyb.driverName" .) }}
{{- end }}

{{/* A mount path for a driver-root subdirectory ("." is the root itself). */}}
{{- define "kyb.driverMountPath" -}}
{{- if eq . "." }}/driver-root{{ else }}{{ printf "/driver-root/%s" (trimSuffix "/" .) }}{{ end }}
{{- end }}

{{- define "kyb.driverHostPath" -}}
{{- $root := trimSuffix "/" .root }}
{{- if eq .sub "." }}{{ default "/" .root }}{{ else }}{{ printf "%s/%s" $root (trimSuffix "/" .sub) }}{{ end }}
{{- end }}

{{/*
Name of an object outside the release's namespace (cluster-scoped, or in
"default"): carries the namespace, so that releases of the same name in two
namespaces do not collide.
*/}}
{{- define "kyb.globalName" -}}
{{- printf "%s-%s" (include "kyb.fullname" .) .Release.Namespace | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- /*
The environment of the node agent's containers, shared by the plugin and
its doctor init container so that the doctor examines what the plugin
uses. Called with a dict: Values and the daemonset's switches (dra,
realGPUs, kubeletDir, seamless, health, metrics).
*/}}
{{- define "kyb.containerEnv" -}}
- name: NODE_NAME
  valueFrom:
    fieldRef:
      fieldPath: spec.nodeName
- name: KYB_CONFIG
  value: /etc/kyb-dra-driver/config.yaml
{{- with $.Values.simulate }}
- name: KYB_SIMULATE
  value: {{ . | quote }}
{{- end }}
- name: CDI_ROOT
  value: {{ $.Values.cdiRoot | quote }}
- name: KUBELET_PLUGINS_DIRECTORY_PATH
  value: {{ printf "%s/plugins" $.kubeletDir | quote }}
{{- if $.realGPUs }}
# The driver root as the plugin sees it, and as the host (and so
# the CDI specs' mounts) sees it.
- name: NVIDIA_DRIVER_ROOT
  value: /driver-root
- name: NVIDIA_HOST_DRIVER_ROOT
  value: {{ $.Values.nvidiaDriver.root | quote }}
- name: KYB_DRIVER_FILES
  value: {{ $.Values.nvidiaDriver.files | quote }}
{{- if $.mig }}
# A MIG profile: the container is privileged and opens the host's
# device nodes itself. Asked for GPUs, the NVIDIA runtime would put a
# copy of /proc/driver/nvidia without the MIG capabilities over the
# driver's own, where NVML finds the config capability's minor.
- name: NVIDIA_VISIBLE_DEVICES
  value: void
{{- else if eq $.Values.gpuAccess "nvidia-runtime" }}
# Asks the NVIDIA container runtime for every GPU's device nodes
# (and the right to open them) for NVML.
- name: NVIDIA_VISIBLE_DEVICES
  value: all
- name: NVIDIA_DRIVER_CAPABILITIES
  value: utility
{{- end }}
{{- else }}
# A simulated node: nothing from the host's driver.
- name: NVIDIA_VISIBLE_DEVICES
  value: void
{{- end }}
{{- if not $.dra }}
- name: POD_RESOURCES_SOCKET
  value: {{ printf "%s/pod-resources/kubelet.sock" $.kubeletDir | quote }}
{{- if $.mps }}
# The shim believes a PodResources listing only once it lists this pod.
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
{{- end }}
{{- end }}
{{- if $.mps }}
{{- with $.Values.mps.control }}
# Empty: the plugin's default (the driver's own; on a simulated node,
# the simulated daemon of its own binary).
- name: KYB_MPS_CONTROL
  value: {{ . | quote }}
{{- end }}
- name: KYB_MPS_CGROUP
  value: {{ $.Values.mps.cgroup | quote }}
- name: KYB_MPS_SHM_SIZE_MIB
  value: {{ $.Values.mps.shmSizeMiB | quote }}
{{- end }}
{{- if $.dra }}
- name: POD_RESOURCES_SOCKET
  value: {{ printf "%s/pod-resources/kubelet.sock" $.kubeletDir | quote }}
- name: KUBELET_REGISTRAR_DIRECTORY_PATH
  value: {{ printf "%s/plugins_registry" $.kubeletDir | quote }}
- name: KYB_DEVICE_LAYOUT
  value: {{ $.Values.kubeletPlugin.deviceLayout | quote }}
- name: KUBE_API_QPS
  value: {{ $.Values.kubeletPlugin.kubeAPIQPS | quote }}
- name: KUBE_API_BURST
  value: {{ $.Values.kubeletPlugin.kubeAPIBurst | quote }}
- name: KUBE_API_BACKGROUND_QPS
  value: {{ $.Values.kubeletPlugin.kubeAPIBackgroundQPS | quote }}
- name: KUBE_API_BACKGROUND_BURST
  value: {{ $.Values.kubeletPlugin.kubeAPIBackgroundBurst | quote }}
{{- if $.seamless }}
# Rolling-update mode of the kubelet plugin helper: sockets named
# after this pod, calls serialised with the other pod by a file lock.
- name: POD_UID
  valueFrom:
    fieldRef:
      fieldPath: metadata.uid
{{- end }}
{{- if $.health }}
- name: HEALTHCHECK_PORT
  value: {{ $.Values.kubeletPlugin.healthcheckPort | quote }}
# The kubelet's gRPC probes connect to the pod IP.
- name: HEALTHCHECK_ADDRESS
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
{{- end }}
{{- if $.metrics }}
- name: METRICS_ADDRESS
  value: {{ printf ":%d" (int $.Values.metrics.port) | quote }}
- name: KYB_GPU_USAGE_INTERVAL
  value: {{ ternary $.Values.metrics.podGPU.interval "0" (and $.podGPU true) | quote }}
{{- if and $.podGPU $.realGPUs }}
# NVML names processes by their host PIDs.
- name: KYB_HOST_PROC
  value: /host/proc
- name: KYB_CONTAINER_RUNTIME_SOCKET
  value: {{ printf "/host%s" $.Values.metrics.podGPU.runtimeSocket | quote }}
{{- end }}
{{- end }}
{{- else }}
- name: DEVICE_PLUGIN_DIRECTORY_PATH
  value: {{ printf "%s/" (include "kyb.devicePluginDir" .) | quote }}
{{- with $.Values.devicePlugin.injection }}
- name: KYB_INJECTION
  value: {{ . | quote }}
{{- end }}
{{- end }}
{{- end }}

{{- /*
The security context of the node agent's containers (see README "Security
context"). Called with the dict of kyb.containerEnv.
*/}}
{{- define "kyb.containerSecurityContext" -}}
{{- if $.mps }}
# values mps: setting compute modes, mounting the daemons' shm
# tmpfs and moving them to their own cgroup.
privileged: true
allowPrivilegeEscalation: true
{{- else if $.mig }}
# A MIG profile: NVML makes and destroys MIG instances only through
# the MIG config capability's node (/dev/nvidia-caps/nvidia-cap1),
# which the device cgroup lets only a privileged container open (the
# NVIDIA runtime too gives it to no other), and the driver switches
# MIG mode only for CAP_SYS_ADMIN.
privileged: true
allowPrivilegeEscalation: true
{{- else if $.privileged }}
# values gpuAccess=privileged: NVML needs the GPUs' device nodes,
# which only a privileged container may open without the NVIDIA
# container runtime's help.
privileged: true
allowPrivilegeEscalation: true
{{- else }}
privileged: false
allowPrivilegeEscalation: false
capabilities:
  drop: ["ALL"]
{{- end }}
# Root without capabilities: the kubelet's and the runtime's
# directories on the host (plugins_registry, plugins,
# device-plugins, the CDI root) are owned by root and not
# writable by anyone else; root may write them as their owner.
runAsUser: 0
runAsGroup: 0
runAsNonRoot: false
readOnlyRootFilesystem: true
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{- /*
The volume mounts of the node agent's containers. Called with the dict of
kyb.containerEnv.
*/}}
{{- define "kyb.volumeMounts" -}}
- name: config
  mountPath: /etc/kyb-dra-driver
  readOnly: true
- name: tmp
  mountPath: /tmp
{{- if $.dra }}
- name: plugins-registry
  mountPath: {{ printf "%s/plugins_registry" $.kubeletDir }}
- name: pod-resources
  mountPath: {{ printf "%s/pod-resources" $.kubeletDir }}
  readOnly: true
{{- else }}
- name: device-plugins
  mountPath: {{ include "kyb.devicePluginDir" . }}
- name: pod-resources
  mountPath: {{ printf "%s/pod-resources" $.kubeletDir }}
  readOnly: true
{{- end }}
- name: plugin-data
  mountPath: {{ $.pluginDataDir }}
{{- if and $.mps (ne (toString $.Values.mps.shmSizeMiB) "unbounded") }}
  # values mps.shmSizeMiB: the daemons' shm tmpfs, mounted by the plugin,
  # must reach the host, where their clients' containers bind-mount it.
  mountPropagation: Bidirectional
{{- end }}
- name: cdi
  mountPath: {{ $.Values.cdiRoot }}
{{- if and $.podGPU $.realGPUs }}
- name: host-proc
  mountPath: /host/proc
  readOnly: true
- name: container-runtime
  mountPath: {{ printf "/host%s" (dir $.Values.metrics.podGPU.runtimeSocket) }}
  readOnly: true
{{- end }}
{{- if $.mountNVIDIACDI }}
- name: nvidia-cdi
  mountPath: /etc/cdi
  readOnly: true
{{- end }}
{{- if $.mig }}
- name: nvidia-caps
  mountPath: /dev/nvidia-caps
  readOnly: true
{{- end }}
{{- if $.realGPUs }}
{{- range $i, $sub := $.Values.nvidiaDriver.mountSubdirectories }}
- name: driver-root-{{ $i }}
  mountPath: {{ include "kyb.driverMountPath" $sub }}
  readOnly: true
  # A driver container that starts (or restarts) after the plugin mounts
  # its root anew: the plugin sees it, and looks again at each prepare.
  mountPropagation: HostToContainer
{{- end }}
{{- end }}
{{- end }}

{{- /*
How the ServiceMonitor and the PodMonitor label what they scrape: the
per-pod GPU series keep their own namespace, pod and container labels
(the workload's, not the plugin pod's), and every series names its node.
*/}}
{{- define "kyb.scrapeLabels" -}}
honorLabels: true
relabelings:
  - sourceLabels: [__meta_kubernetes_pod_node_name]
    targetLabel: node
{{- end }}

{{- /*
kyb-scheduler (values scheduler): the name of its ServiceAccount,
ConfigMap and Deployment, and the labels of its pods.
*/}}
{{- define "kyb.schedulerFullname" -}}
{{- printf "%s-scheduler" (include "kyb.fullname" . | trunc 53 | trimSuffix "-") }}
{{- end }}

{{- define "kyb.schedulerSelectorLabels" -}}
{{ include "kyb.selectorLabels" . }}
app.kubernetes.io/component: scheduler
{{- end }}

{{- /*
kyb-scheduler's KubeSchedulerConfiguration: values scheduler.config as
written, else the profile of kyb-scheduler's built-in configuration
(cmd/kyb-scheduler/app DefaultProfile: the placement score at its weight,
NodeResourcesFit scoring MostAllocated) with the values' name, policy,
per-class policies and weight. A file with profiles keeps them as written,
so the profile is whole here. No leaderElection: the Deployment's flags
set the lease, whatever the configuration says.
*/}}
{{- define "kyb.schedulerConfig" -}}
{{- if .Values.scheduler.config }}
{{- toYaml .Values.scheduler.config }}
{{- else }}
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
profiles:
  - schedulerName: {{ .Values.scheduler.name | quote }}
    plugins:
      multiPoint:
        enabled:
          - name: KybPlacement
            weight: {{ int .Values.scheduler.weight }}
          # Preemption that frees the devices of the pods it evicts.
          - name: KybPreemption
        disabled:
          - name: DefaultPreemption
      # Its PreFilter first: it leaves the order in which the
      # DynamicResources plugin's allocator tries a node's devices.
      preFilter:
        enabled:
          - name: KybPlacement
    pluginConfig:
      - name: KybPlacement
        args:
          defaultPolicy: {{ .Values.scheduler.policy | quote }}
          {{- with .Values.scheduler.deviceClassPolicies }}
          deviceClassPolicies:
            {{- toYaml . | nindent 12 }}
          {{- end }}
      # Its default, LeastAllocated, spreads pods by CPU and memory: on
      # nodes alike consecutive seat pods would land on different nodes.
      - name: NodeResourcesFit
        args:
          scoringStrategy:
            type: MostAllocated
{{- end }}
{{- end }}
