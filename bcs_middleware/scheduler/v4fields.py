"""The bcs v4 types the source's mesos-driver and bcs-scheduler decode request bodies into.

Written by hand from TencentBlueKing/bk-bcs at ``29cb7354`` (the last tree with the
``bcs-runtime/bcs-mesos`` drivers), ``bcs-common/common/types/``: ``meta.go``
(``TypeMeta``, ``ObjectMeta``, ``KeyToValue``), ``rc.go`` (``ReplicaController`` and
its pod types), ``deployment.go``, ``daemonset.go``, ``constraint.go``,
``configmap.go``, ``secret.go``, ``service.go``, ``resource.go``
(``BcsClusterAgentSetting``, ``ExtendedResource``), ``command.go``, ``crd.go``,
``endpoint.go`` (``TargetRef``); and the driver's own ``SendMsgOpeParam``
(``bcs-mesos-driver/mesosdriver/backend/v4http/types.go``).

Each :class:`~bcs_middleware.core.gotypes.Struct` lists the fields Go's ``encoding/json``
decodes, in Go's field order, by the name it matches: the tag's name, or the Go
field name where the field has no tag (``Uri``, ``ExtendedResource``;
``BcsConfigMapItem.RemoteUser``'s tag is misspelt ``josn:`` in the source, so its
key is ``RemoteUser``). Embedded structs tagged ``json:",inline"`` (or untagged)
are flattened where they are embedded; ``json:"-"`` fields are left out.

Which route decodes into which type is :mod:`bcs_middleware.scheduler.routes`
(``body_type``).
"""

from __future__ import annotations

from ..core.gotypes import (
    ANY,
    BOOL,
    FLOAT64,
    INT,
    INT32,
    INT64,
    STRING,
    TIME,
    UINT32,
    UINT64,
    Field,
    GoType,
    Map,
    Ptr,
    Slice,
    Struct,
)


def _struct(name: str, *fields: tuple[str, GoType]) -> Struct:
    return Struct(name, tuple(Field(key, gotype) for key, gotype in fields))


# meta.go: TypeMeta is embedded `json:",inline"` — its two fields sit at the top of each type.
TYPE_META = (("apiVersion", STRING), ("kind", STRING))
OBJECT_META = _struct(
    "ObjectMeta",
    ("name", STRING), ("namespace", STRING), ("creationTimestamp", TIME),
    ("labels", Map(STRING)), ("annotations", Map(STRING)), ("clusterName", STRING),
)
KEY_TO_VALUE = _struct("KeyToValue", ("key", STRING), ("value", STRING))

# rc.go
RESOURCE_FIELD_SELECTOR = _struct("ResourceFieldSelector", ("resource", STRING))
ENV_VAR_SOURCE = _struct("EnvVarSource", ("resourceFieldRef", Ptr(RESOURCE_FIELD_SELECTOR)))
ENV_VAR = _struct("EnvVar", ("name", STRING), ("value", STRING), ("valueFrom", Ptr(ENV_VAR_SOURCE)))
CONTAINER_PORT = _struct(
    "ContainerPort",
    ("name", STRING), ("hostPort", INT), ("containerPort", INT), ("hostIP", STRING), ("protocol", STRING),
)
SECRET_ITEM = _struct(
    "SecretItem",
    ("type", STRING), ("dataKey", STRING), ("keyOrPath", STRING), ("subPath", STRING), ("readOnly", BOOL),
    ("user", STRING),
)
SECRET = _struct("Secret", ("secretName", STRING), ("items", Slice(SECRET_ITEM)))
KEY_TO_PATH = _struct(
    "KeyToPath",
    ("type", STRING), ("dataKey", STRING), ("dataKeyAlias", STRING), ("keyOrPath", STRING), ("subPath", STRING),
    ("readOnly", BOOL), ("user", STRING),
)
CONFIG_MAP = _struct("ConfigMap", ("name", STRING), ("items", Slice(KEY_TO_PATH)))
VOLUME = _struct("Volume", ("hostPath", STRING), ("mountPath", STRING), ("subPath", STRING), ("readOnly", BOOL))
VOLUME_UNIT = _struct("VolumeUnit", ("name", STRING), ("volume", VOLUME))
RESOURCE_LIST = _struct("ResourceList", ("cpu", STRING), ("memory", STRING), ("storage", STRING))
# resource.go: no JSON tags.
EXTENDED_RESOURCE = _struct(
    "ExtendedResource",
    ("InnerIP", STRING), ("Name", STRING), ("Value", FLOAT64), ("Capacity", FLOAT64), ("Socket", STRING),
)
RESOURCE_REQUIREMENTS = _struct(
    "ResourceRequirements",
    ("limits", RESOURCE_LIST), ("requests", RESOURCE_LIST), ("extendedResources", Slice(Ptr(EXTENDED_RESOURCE))),
)
COMMAND_HEALTH_CHECK = _struct("CommandHealthCheck", ("value", STRING))
HTTP_HEALTH_CHECK = _struct(
    "HttpHealthCheck",
    ("port", INT32), ("portName", STRING), ("scheme", STRING), ("path", STRING), ("headers", Map(STRING)),
)
TCP_HEALTH_CHECK = _struct("TcpHealthCheck", ("port", INT32), ("portName", STRING))
HEALTH_CHECK = _struct(
    "HealthCheck",
    ("type", STRING), ("delaySeconds", INT), ("gracePeriodSeconds", INT), ("intervalSeconds", INT),
    ("timeoutSeconds", INT), ("consecutiveFailures", UINT32), ("command", Ptr(COMMAND_HEALTH_CHECK)),
    ("http", Ptr(HTTP_HEALTH_CHECK)), ("tcp", Ptr(TCP_HEALTH_CHECK)),
)
CONTAINER = _struct(
    "Container",
    ("name", STRING), ("hostname", STRING), ("command", STRING), ("args", Slice(STRING)),
    ("parameters", Slice(Ptr(KEY_TO_VALUE))), ("type", STRING), ("image", STRING), ("imagePullUser", STRING),
    ("imagePullPasswd", STRING), ("imagePullPolicy", STRING), ("privileged", BOOL), ("env", Slice(ENV_VAR)),
    ("workingDir", STRING), ("ports", Slice(CONTAINER_PORT)), ("healthChecks", Slice(Ptr(HEALTH_CHECK))),
    ("resources", RESOURCE_REQUIREMENTS), ("volumes", Slice(VOLUME_UNIT)), ("configmaps", Slice(CONFIG_MAP)),
    ("secrets", Slice(SECRET)),
)
URI = _struct("Uri", ("Value", STRING), ("User", STRING), ("Pwd", STRING), ("OutputDir", STRING))
PROCESS = _struct(
    "Process",
    ("procName", STRING), ("workPath", STRING), ("uris", Slice(Ptr(URI))), ("pidFile", STRING),
    ("startCmd", STRING), ("checkCmd", STRING), ("stopCmd", STRING), ("restartCmd", STRING),
    ("reloadCmd", STRING), ("killCmd", STRING), ("logPath", STRING), ("cfgPath", STRING), ("user", STRING),
    ("procGroup", STRING), ("env", Slice(ENV_VAR)), ("healthChecks", Slice(Ptr(HEALTH_CHECK))),
    ("resources", RESOURCE_REQUIREMENTS), ("configmaps", Slice(CONFIG_MAP)), ("secrets", Slice(SECRET)),
    ("ports", Slice(CONTAINER_PORT)), ("startGracePeriod", INT),
)
NET_LIMIT = _struct("NetLimit", ("egressLimit", INT))
POD_SPEC = _struct(
    "PodSpec",
    ("nodeSelector", Map(STRING)), ("containers", Slice(CONTAINER)), ("processes", Slice(PROCESS)),
    ("networkMode", STRING), ("networktype", STRING), ("netLimit", Ptr(NET_LIMIT)),
)
POD_TEMPLATE_SPEC = _struct("PodTemplateSpec", ("metadata", OBJECT_META), ("spec", POD_SPEC))
REPLICA_CONTROLLER_SPEC = _struct(
    "ReplicaControllerSpec",
    ("instance", INT), ("selector", Map(STRING)), ("template", Ptr(POD_TEMPLATE_SPEC)),
)
UPDATE_POLICY = _struct(
    "UpdatePolicy", ("updateDelay", INT), ("maxRetries", INT), ("maxFailovers", INT), ("action", STRING),
)
RESTART_POLICY = _struct(
    "RestartPolicy",
    ("policy", STRING), ("interval", INT), ("backoff", INT), ("maxtimes", INT), ("hostRetainTime", INT64),
)
KILL_POLICY = _struct("KillPolicy", ("gracePeriod", INT64))

# constraint.go
CONSTRAINT_DATA = _struct(
    "ConstraintData",
    ("name", STRING), ("operate", STRING), ("type", INT32),
    ("scalar", Ptr(_struct("ConstraintValue_Scalar", ("value", FLOAT64)))),
    ("ranges", Slice(Ptr(_struct("ConstraintValue_Range", ("begin", UINT64), ("end", UINT64))))),
    ("text", Ptr(_struct("ConstraintValue_Text", ("value", STRING)))),
    ("set", Ptr(_struct("ConstraintValue_Set", ("item", Slice(STRING))))),
)
CONSTRAINT = _struct(
    "Constraint",
    ("intersectionItem", Slice(Ptr(_struct("ConstraintDataItem", ("unionData", Slice(Ptr(CONSTRAINT_DATA))))))),
    ("nodeSelector", Map(STRING)),
)

REPLICA_CONTROLLER = _struct(
    "ReplicaController",
    *TYPE_META, ("metadata", OBJECT_META), ("spec", REPLICA_CONTROLLER_SPEC), ("updatePolicy", UPDATE_POLICY),
    ("restartPolicy", RESTART_POLICY), ("killPolicy", KILL_POLICY), ("constraint", Ptr(CONSTRAINT)),
)

# deployment.go
ROLLING_UPDATE = _struct(
    "RollingUpdate",
    ("maxUnavilable", INT), ("maxSurge", INT), ("upgradeDuration", UINT32), ("rollingManually", BOOL),
    ("rollingOrder", STRING),
)
UPGRADE_STRATEGY = _struct("UpgradeStrategy", ("type", STRING), ("rollingupdate", Ptr(ROLLING_UPDATE)))
BCS_DEPLOYMENT = _struct(
    "BcsDeployment",
    *TYPE_META, ("metadata", OBJECT_META),
    ("spec", _struct("BcsDeploymentSpec", ("instance", INT), ("selector", Map(STRING)),
                     ("template", Ptr(POD_TEMPLATE_SPEC)), ("strategy", UPGRADE_STRATEGY),
                     ("pauseDeployment", BOOL))),
    ("updatePolicy", UPDATE_POLICY), ("restartPolicy", RESTART_POLICY), ("killPolicy", KILL_POLICY),
    ("constraint", Ptr(CONSTRAINT)),
)

# daemonset.go
BCS_DAEMONSET = _struct(
    "BcsDaemonset",
    *TYPE_META, ("metadata", OBJECT_META), ("spec", REPLICA_CONTROLLER_SPEC), ("restartPolicy", RESTART_POLICY),
    ("killPolicy", KILL_POLICY),
)

# configmap.go, secret.go, service.go
BCS_CONFIG_MAP = _struct(
    "BcsConfigMap",
    *TYPE_META, ("metadata", OBJECT_META),
    ("datas", Map(_struct("BcsConfigMapItem", ("type", STRING), ("content", STRING), ("RemoteUser", STRING),
                          ("remotePasswd", STRING)))),
)
BCS_SECRET = _struct(
    "BcsSecret",
    *TYPE_META, ("metadata", OBJECT_META), ("type", STRING),
    ("datas", Map(_struct("SecretDataItem", ("content", STRING)))),
)
BCS_SERVICE = _struct(
    "BcsService",
    *TYPE_META, ("metadata", OBJECT_META),
    ("spec", _struct("ServiceSpec", ("selector", Map(STRING)), ("type", STRING), ("clusterIP", Slice(STRING)),
                     ("ports", Slice(_struct("ServicePort", ("name", STRING), ("domainName", STRING),
                                             ("path", STRING), ("protocol", STRING), ("servicePort", INT),
                                             ("targetPort", INT), ("nodePort", INT)))))),
)

# resource.go: what POST agentsettings and PUT agentsettings/taint decode (a list of these).
BCS_CLUSTER_AGENT_SETTING = _struct(
    "BcsClusterAgentSetting",
    ("innerIP", STRING), ("disabled", BOOL), ("strings", Map(_struct("MesosValue_Text", ("value", STRING)))),
    ("scalars", Map(_struct("MesosValue_Scalar", ("value", FLOAT64)))), ("noSchedule", Map(STRING)),
    ("pods", Slice(STRING)), ("ExtendedResources", Map(Ptr(EXTENDED_RESOURCE))),
)
AGENT_SETTINGS = Slice(Ptr(BCS_CLUSTER_AGENT_SETTING))

# command.go, endpoint.go (TargetRef), crd.go
BCS_COMMAND = _struct(
    "BcsCommand",
    *TYPE_META,
    ("spec", Ptr(_struct(
        "BcsCommandSpec",
        ("commandTargetRef", Ptr(_struct("TargetRef", ("kind", STRING), ("id", STRING), ("name", STRING),
                                         ("namespace", STRING), ("image", STRING)))),
        ("taskgroups", Slice(STRING)), ("command", Slice(STRING)), ("env", Slice(STRING)), ("user", STRING),
        ("workingDir", STRING), ("privileged", BOOL), ("reserveTime", INT)))),
)
CRR = _struct("Crr", *TYPE_META, ("spec", _struct("CrrSpec", ("names", _struct("CrrSpecName", ("kind", STRING))))))
CRD = _struct("Crd", *TYPE_META, ("metadata", OBJECT_META), ("spec", ANY), ("status", ANY))

# bcs-mesos-driver .../v4http/types.go: OperateItem is embedded untagged (its fields promoted).
SEND_MSG_OPE_PARAM = _struct(
    "SendMsgOpeParam",
    ("name", STRING), ("namespace", STRING), ("setid", STRING), ("moduleid", STRING), ("msgtype", STRING),
    ("msgdata", ANY), ("taskgroupid", STRING),
)
