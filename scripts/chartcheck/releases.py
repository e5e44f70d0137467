"""The values the chart is rendered with: the releases it must accept, the value sets it must
refuse (with the text expected), and the few expectations tied to them."""

from __future__ import annotations


# Chart defaults that deliberately differ from the controller's: JSON logs in a cluster.
DIFFERENT_DEFAULTS = {"SHARDWISE_LOG_FORMAT": "json"}

# Every optional part on (but the ServiceMonitor, exclusive with the PodMonitor: release "x" has
# it), under a release name without "shardwise" in it.
EVERYTHING = {
    "replicas": 5,
    "image": {"repository": "registry.example.com/shardwise", "tag": "1.2.3", "pullPolicy": "Always"},
    "imagePullSecrets": [{"name": "registry"}],
    "controller": {
        "strategy": "bounded-load",
        "loadFactor": 1.5,
        "auditFile": "/var/lib/shardwise/audit.jsonl",
        "shutdownTimeout": "1m",
        "listenAddress": "[::]",
    },
    "extraArgs": ["--log=info,kube=warn"],
    "extraEnv": [{"name": "RUST_BACKTRACE", "value": "1"}],
    "envFrom": [{"secretRef": {"name": "shardwise-env"}}, {"configMapRef": {"name": "proxy"}, "prefix": "FLEET_"}],
    "extraVolumes": [{"name": "fleet-ca", "configMap": {"name": "fleet-ca"}}],
    "extraVolumeMounts": [{"name": "fleet-ca", "mountPath": "/etc/fleet-ca", "readOnly": True}],
    "revisionHistoryLimit": 2,
    "startupProbe": {"httpGet": {"path": "/healthz", "port": "health"}, "periodSeconds": 5, "failureThreshold": 12},
    "podAntiAffinity": "hard",
    "crds": {"upgrade": True, "keep": False},
    "tests": {"image": {"repository": "registry.example.com/busybox", "tag": "1.36.1"}, "timeoutSeconds": 30},
    "prometheusRule": {
        "enabled": True,
        "namespace": "monitoring",
        "additionalLabels": {"release": "kube-prometheus-stack"},
        "annotations": {"example.com/owner": "platform"},
        "alertLabels": {"team": "platform"},
        "alerts": {
            "ShardwiseImbalanced": {"enabled": False},
            "ShardwiseQueueBacklog": {"for": "30m", "severity": "critical", "threshold": 500},
        },
        "extraRules": [{"alert": "ShardwiseDown", "expr": 'up{job="shardwise"} == 0', "for": "5m"}],
    },
    "terminationGracePeriodSeconds": 90,
    "serviceAccount": {"annotations": {"example.com/role": "fleet"}},
    "rbac": {"create": True, "clusterSecrets": ["prod-eu-1", "prod-us-1"]},
    "podAnnotations": {"example.com/team": "platform"},
    "podLabels": {"team": "platform"},
    "priorityClassName": "system-cluster-critical",
    "nodeSelector": {"kubernetes.io/os": "linux"},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "fleet", "effect": "NoSchedule"}],
    "topologySpreadConstraints": [
        {
            "maxSkew": 1,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "shardwise"}},
        }
    ],
    "autoscaling": {"enabled": True, "targetMemoryUtilizationPercentage": 80},
    # Every sizing setting but `autoscale`, which the HorizontalPodAutoscaler excludes (release
    # "sized" has it).
    "sizing": {
        "appsPerReplica": 2000,
        "busyPerReplica": 2.5,
        "cachePerReplica": "512Mi",
        "minReplicas": 2,
        "maxReplicas": 40,
        "scaleUpWindow": "30s",
        "scaleDownWindow": "10m",
    },
    "metrics": {
        "certSecret": "shardwise-metrics-tls",
        "readers": [{"kind": "ServiceAccount", "name": "prometheus-k8s", "namespace": "monitoring"}],
        "podMonitor": {
            "enabled": True,
            "labels": {"release": "kube-prometheus-stack"},
            "bearerTokenSecret": {"name": "shardwise-scraper", "key": "token"},
        },
    },
    "dashboards": {
        "enabled": True,
        "annotations": {"grafana_folder": "Shardwise"},
        "namespace": "monitoring",
    },
    # Literal application namespaces (one of them Argo CD's own, which needs no Role of its own),
    # and every setting away from its default.
    "argocdBalancer": {
        "enabled": True,
        "namespace": "gitops",
        "controller": "gitops-application-controller",
        "applicationNamespaces": ["team-a", "gitops", "team-b"],
        "load": "resources",
        "interval": 120,
        "maxExtraMoves": 7,
        "targetBalance": 1.1,
        "dryRun": True,
        "refreshMovedApps": False,
        "manageReplicas": True,
        "loadPerReplica": 1500.5,
        "minReplicas": 3,
        "maxReplicas": 6,
        "scaleDownWindow": 900,
        "replicas": 2,
        "log": "info,shardwise_cli=debug",
    },
}

# Only the Argo CD balancer: a pattern among the application namespaces (so a ClusterRole), the
# ServiceMonitor (so a Service of its own) and the dashboard.
BALANCER_ONLY = {
    "controller": {"enabled": False},
    "argocdBalancer": {"enabled": True, "applicationNamespaces": ["team-a", "apps-*"]},
    "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}}},
    "prometheusRule": {"enabled": True},
    "dashboards": {"enabled": True},
}

# The planner sets the replicas: busyPerReplica as `--set` passes a decimal, a string.
SIZED = {
    "sizing": {"autoscale": True, "busyPerReplica": "0.75", "minReplicas": 2, "scaleDownWindow": "1h"},
}

# The one rule the Role gains with `sizing.autoscale`, and only then.
SCALE_RULE = {"apiGroups": ["apps"], "resources": ["statefulsets/scale"], "verbs": ["get", "update"]}

# Values the chart must refuse, by the schema or at render time, with the text expected.
INVALID = [
    ({"replicas": 0}, "replicas"),
    ({"controller": {"strategy": "random"}}, "strategy"),
    ({"controller": {"leaseDuration": "15 seconds"}}, "leaseDuration"),
    ({"controller": {"loadFactor": "1,5"}}, "loadFactor"),
    ({"controller": {"virtualNodes": 20000}}, "virtualNodes"),
    ({"controller": {"auditFile": "audit.jsonl"}}, "auditFile"),
    ({"controller": {"unknownSetting": 1}}, "unknownSetting"),
    (
        {"controller": {"leaseDuration": "10s", "renewDeadline": "10s"}},
        "renewDeadline must be at least 1s shorter",
    ),
    ({"controller": {"retryPeriod": "10s"}}, "retryPeriod must be shorter"),
    ({"terminationGracePeriodSeconds": 24}, "terminationGracePeriodSeconds (24) must exceed"),
    ({"autoscaling": {"enabled": True, "targetCPUUtilizationPercentage": None}}, "autoscaling.enabled needs"),
    ({"metrics": {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True}}}, "not both"),
    ({"rbac": {"clusterSecrets": [""]}}, "clusterSecrets"),
    ({"metrics": {"podMonitor": {"enabled": True}}}, "bearerTokenSecret"),
    ({"metrics": {"readers": [{"name": "prometheus"}]}}, "kind"),
    ({"podAntiAffinity": "sometimes"}, "podAntiAffinity"),
    ({"revisionHistoryLimit": -1}, "revisionHistoryLimit"),
    ({"envFrom": [{}]}, "envFrom"),
    ({"extraVolumeMounts": [{"name": "ca"}]}, "mountPath"),
    ({"extraVolumes": [{"configMap": {"name": "ca"}}]}, "name"),
    ({"crds": {"upgrade": "yes"}}, "upgrade"),
    ({"tests": {"image": {"tag": ""}}}, "tag"),
    ({"prometheusRule": {"alerts": {"ShardwiseTypo": {"enabled": True}}}}, "ShardwiseTypo"),
    ({"prometheusRule": {"alerts": {"ShardwiseQueueBacklog": {"threshold": "lots"}}}}, "threshold"),
    ({"prometheusRule": {"alerts": {"ShardwiseFenced": {"for": "15 minutes"}}}}, "for"),
    ({"prometheusRule": {"extraRules": [{"alert": "Empty", "expr": ""}]}}, "expr"),
    ({"controller": {"enabled": "no"}}, "enabled"),
    ({"argocdBalancer": {"enabled": True, "load": "weight"}}, "load"),
    ({"argocdBalancer": {"interval": 0}}, "interval"),
    ({"argocdBalancer": {"minReplicas": 1}}, "minReplicas"),
    ({"argocdBalancer": {"loadPerReplica": 0}}, "loadPerReplica"),
    ({"argocdBalancer": {"interval": 3601}}, "interval"),
    ({"argocdBalancer": {"interval": "30s"}}, "interval"),
    ({"argocdBalancer": {"maxExtraMoves": -1}}, "maxExtraMoves"),
    ({"argocdBalancer": {"targetBalance": "0.9"}}, "targetBalance"),
    ({"argocdBalancer": {"targetBalance": 0.5}}, "targetBalance"),
    ({"argocdBalancer": {"replicas": -1}}, "replicas"),
    ({"argocdBalancer": {"namespace": ""}}, "namespace"),
    ({"argocdBalancer": {"controller": "Argo CD"}}, "controller"),
    # Argo CD's regular expressions and glob classes, which the balancer refuses, and a comma,
    # which would split one entry into two namespaces.
    ({"argocdBalancer": {"applicationNamespaces": ["/team-.*/"]}}, "applicationNamespaces"),
    ({"argocdBalancer": {"applicationNamespaces": ["team-[ab]"]}}, "applicationNamespaces"),
    ({"argocdBalancer": {"applicationNamespaces": ["team-a,team-b"]}}, "applicationNamespaces"),
    ({"argocdBalancer": {"applicationNamespaces": ["team-a", "team-a"]}}, "applicationNamespaces"),
    ({"argocdBalancer": {"leaseName": "mine"}}, "leaseName"),
    (
        {"sizing": {"autoscale": True}, "autoscaling": {"enabled": True}},
        "sizing.autoscale and autoscaling.enabled",
    ),
    (
        {"sizing": {"minReplicas": 4, "maxReplicas": 3}},
        "sizing.minReplicas (4) must not exceed sizing.maxReplicas (3)",
    ),
    ({"sizing": {"appsPerReplica": 0}}, "appsPerReplica"),
    ({"sizing": {"busyPerReplica": 0}}, "busyPerReplica"),
    ({"sizing": {"busyPerReplica": "0.0"}}, "busyPerReplica"),
    ({"sizing": {"busyPerReplica": "1,5"}}, "busyPerReplica"),
    ({"sizing": {"cachePerReplica": "2GB"}}, "cachePerReplica"),
    ({"sizing": {"cachePerReplica": 512}}, "cachePerReplica"),
    ({"controller": {"loadMemoryWeight": 1.5}}, "loadMemoryWeight"),
    ({"sizing": {"maxReplicas": 0}}, "maxReplicas"),
    ({"sizing": {"autoscale": "yes"}}, "autoscale"),
    ({"sizing": {"scaleUpWindow": "1 minute"}}, "scaleUpWindow"),
    ({"sizing": {"scaleDownWindow": "1h1s"}}, "sizing.scaleDownWindow (1h1s) must be at most 1h"),
    ({"sizing": {"targetReplicas": 3}}, "targetReplicas"),
]
