//! Feature gates kube-proxy v1.33 knows, parsing of the `--feature-gates` flag, and the
//! `SetFromMap` checks used by validation.
//!
//! Two lists: the alpha and beta gates (seed 000's `--feature-gates` help, which like upstream's
//! help omits the rest) and the GA and deprecated gates v1.33 still registers
//! (`pkg/features/kube_features.go` at v1.33). Setting a GA or deprecated gate is accepted with
//! upstream's warning; setting a locked gate to anything but its default is an error.

use std::collections::BTreeMap;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    Alpha,
    Beta,
    GA,
    Deprecated,
}

/// (name, stage, default)
pub const KNOWN_GATES: &[(&str, Stage, bool)] = &[
    ("APIResponseCompression", Stage::Beta, true),
    ("APIServerIdentity", Stage::Beta, true),
    ("APIServerTracing", Stage::Beta, true),
    ("APIServingWithRoutine", Stage::Alpha, false),
    ("AllAlpha", Stage::Alpha, false),
    ("AllBeta", Stage::Beta, false),
    ("AllowParsingUserUIDFromCertAuth", Stage::Beta, true),
    ("AllowUnsafeMalformedObjectDeletion", Stage::Alpha, false),
    ("AnonymousAuthConfigurableEndpoints", Stage::Beta, true),
    ("AuthorizeNodeWithSelectors", Stage::Beta, true),
    ("AuthorizeWithSelectors", Stage::Beta, true),
    ("CBORServingAndStorage", Stage::Alpha, false),
    ("CPUManagerPolicyAlphaOptions", Stage::Alpha, false),
    ("CPUManagerPolicyBetaOptions", Stage::Beta, true),
    ("CSIVolumeHealth", Stage::Alpha, false),
    ("ClientsAllowCBOR", Stage::Alpha, false),
    ("ClientsPreferCBOR", Stage::Alpha, false),
    ("CloudControllerManagerWebhook", Stage::Alpha, false),
    ("ClusterTrustBundle", Stage::Beta, false),
    ("ClusterTrustBundleProjection", Stage::Beta, false),
    ("ComponentFlagz", Stage::Alpha, false),
    ("ComponentStatusz", Stage::Alpha, false),
    ("ConcurrentWatchObjectDecode", Stage::Beta, false),
    ("ConsistentListFromCache", Stage::Beta, true),
    ("ContainerCheckpoint", Stage::Beta, true),
    ("ContainerStopSignals", Stage::Alpha, false),
    ("ContextualLogging", Stage::Beta, true),
    ("CoordinatedLeaderElection", Stage::Beta, false),
    ("CrossNamespaceVolumeDataSource", Stage::Alpha, false),
    ("CustomCPUCFSQuotaPeriod", Stage::Alpha, false),
    ("DRAAdminAccess", Stage::Alpha, false),
    ("DRADeviceTaints", Stage::Alpha, false),
    ("DRAPartitionableDevices", Stage::Alpha, false),
    ("DRAPrioritizedList", Stage::Alpha, false),
    ("DRAResourceClaimDeviceStatus", Stage::Beta, true),
    ("DeclarativeValidation", Stage::Beta, true),
    ("DeclarativeValidationTakeover", Stage::Beta, false),
    (
        "DeploymentReplicaSetTerminatingReplicas",
        Stage::Alpha,
        false,
    ),
    ("DisableAllocatorDualWrite", Stage::Beta, false),
    ("DisableCPUQuotaWithExclusiveCPUs", Stage::Beta, true),
    ("DynamicResourceAllocation", Stage::Beta, false),
    ("EventedPLEG", Stage::Alpha, false),
    ("ExternalServiceAccountTokenSigner", Stage::Alpha, false),
    ("GracefulNodeShutdown", Stage::Beta, true),
    ("GracefulNodeShutdownBasedOnPodPriority", Stage::Beta, true),
    ("HPAConfigurableTolerance", Stage::Alpha, false),
    ("HPAScaleToZero", Stage::Alpha, false),
    ("ImageMaximumGCAge", Stage::Beta, true),
    ("ImageVolume", Stage::Beta, false),
    ("InOrderInformers", Stage::Beta, true),
    ("InPlacePodVerticalScaling", Stage::Beta, true),
    (
        "InPlacePodVerticalScalingExclusiveCPUs",
        Stage::Alpha,
        false,
    ),
    ("InTreePluginPortworxUnregister", Stage::Alpha, false),
    ("InformerResourceVersion", Stage::Alpha, false),
    ("JobManagedBy", Stage::Beta, true),
    ("JobPodReplacementPolicy", Stage::Beta, true),
    ("KubeletCgroupDriverFromCRI", Stage::Beta, true),
    ("KubeletCrashLoopBackOffMax", Stage::Alpha, false),
    ("KubeletEnsureSecretPulledImages", Stage::Alpha, false),
    ("KubeletFineGrainedAuthz", Stage::Beta, true),
    ("KubeletInUserNamespace", Stage::Alpha, false),
    ("KubeletPSI", Stage::Alpha, false),
    ("KubeletPodResourcesDynamicResources", Stage::Alpha, false),
    ("KubeletPodResourcesGet", Stage::Alpha, false),
    ("KubeletSeparateDiskGC", Stage::Beta, true),
    (
        "KubeletServiceAccountTokenForCredentialProviders",
        Stage::Alpha,
        false,
    ),
    ("KubeletTracing", Stage::Beta, true),
    ("ListFromCacheSnapshot", Stage::Alpha, false),
    (
        "LocalStorageCapacityIsolationFSQuotaMonitoring",
        Stage::Beta,
        false,
    ),
    ("LoggingAlphaOptions", Stage::Alpha, false),
    ("LoggingBetaOptions", Stage::Beta, true),
    ("MatchLabelKeysInPodTopologySpread", Stage::Beta, true),
    ("MaxUnavailableStatefulSet", Stage::Alpha, false),
    ("MemoryQoS", Stage::Alpha, false),
    ("MutableCSINodeAllocatableCount", Stage::Alpha, false),
    ("MutatingAdmissionPolicy", Stage::Alpha, false),
    ("NodeLogQuery", Stage::Beta, false),
    ("NodeSwap", Stage::Beta, true),
    ("OpenAPIEnums", Stage::Beta, true),
    ("OrderedNamespaceDeletion", Stage::Beta, true),
    ("PodAndContainerStatsFromCRI", Stage::Alpha, false),
    ("PodDeletionCost", Stage::Beta, true),
    ("PodLevelResources", Stage::Alpha, false),
    ("PodLifecycleSleepAction", Stage::Beta, true),
    ("PodLifecycleSleepActionAllowZero", Stage::Beta, true),
    ("PodLogsQuerySplitStreams", Stage::Alpha, false),
    ("PodObservedGenerationTracking", Stage::Alpha, false),
    ("PodReadyToStartContainersCondition", Stage::Beta, true),
    ("PodTopologyLabelsAdmission", Stage::Alpha, false),
    ("PortForwardWebsockets", Stage::Beta, true),
    ("PreferSameTrafficDistribution", Stage::Alpha, false),
    ("ProcMountType", Stage::Beta, true),
    ("QOSReserved", Stage::Alpha, false),
    ("RecoverVolumeExpansionFailure", Stage::Beta, true),
    ("ReduceDefaultCrashLoopBackOffDecay", Stage::Alpha, false),
    ("RelaxedDNSSearchValidation", Stage::Beta, true),
    ("RelaxedEnvironmentVariableValidation", Stage::Beta, true),
    ("ReloadKubeletServerCertificateFile", Stage::Beta, true),
    ("RemoteRequestHeaderUID", Stage::Beta, true),
    ("ResilientWatchCacheInitialization", Stage::Beta, true),
    ("ResourceHealthStatus", Stage::Alpha, false),
    ("RotateKubeletServerCertificate", Stage::Beta, true),
    ("RuntimeClassInImageCriApi", Stage::Alpha, false),
    ("SELinuxChangePolicy", Stage::Beta, true),
    ("SELinuxMount", Stage::Beta, false),
    ("SELinuxMountReadWriteOncePod", Stage::Beta, true),
    ("SchedulerAsyncPreemption", Stage::Beta, true),
    ("SchedulerPopFromBackoffQ", Stage::Beta, true),
    ("SchedulerQueueingHints", Stage::Beta, true),
    ("SeparateTaintEvictionController", Stage::Beta, true),
    ("ServiceAccountNodeAudienceRestriction", Stage::Beta, true),
    ("StorageCapacityScoring", Stage::Alpha, false),
    ("StorageVersionAPI", Stage::Alpha, false),
    ("StorageVersionHash", Stage::Beta, true),
    ("StorageVersionMigrator", Stage::Alpha, false),
    ("StreamingCollectionEncodingToJSON", Stage::Beta, true),
    ("StreamingCollectionEncodingToProtobuf", Stage::Beta, true),
    ("StrictIPCIDRValidation", Stage::Alpha, false),
    ("StructuredAuthenticationConfiguration", Stage::Beta, true),
    ("SupplementalGroupsPolicy", Stage::Beta, true),
    ("SystemdWatchdog", Stage::Beta, true),
    ("TopologyManagerPolicyAlphaOptions", Stage::Alpha, false),
    ("TopologyManagerPolicyBetaOptions", Stage::Beta, true),
    ("TranslateStreamCloseWebsocketRequests", Stage::Beta, true),
    ("UnauthenticatedHTTP2DOSMitigation", Stage::Beta, true),
    ("UnknownVersionInteroperabilityProxy", Stage::Alpha, false),
    ("UserNamespacesPodSecurityStandards", Stage::Alpha, false),
    ("UserNamespacesSupport", Stage::Beta, true),
    ("VolumeAttributesClass", Stage::Beta, false),
    ("WatchCacheInitializationPostStartHook", Stage::Beta, false),
    ("WatchList", Stage::Beta, false),
    ("WatchListClient", Stage::Beta, false),
    ("WinDSR", Stage::Beta, true),
    ("WinOverlay", Stage::Beta, true),
    ("WindowsCPUAndMemoryAffinity", Stage::Alpha, false),
    ("WindowsGracefulNodeShutdown", Stage::Alpha, false),
];

/// GA and deprecated gates kube-proxy v1.33 still knows: (name, stage, default, locked).
/// Hidden from `--help` like upstream's, but accepted in `--feature-gates` and `featureGates`.
pub const GRADUATED_GATES: &[(&str, Stage, bool, bool)] = &[
    (
        "AggregatedDiscoveryRemoveBetaType",
        Stage::Deprecated,
        true,
        false,
    ),
    ("AllowDNSOnlyNodeCSR", Stage::Deprecated, false, false),
    (
        "AllowInsecureKubeletCertificateSigningRequests",
        Stage::Deprecated,
        false,
        false,
    ),
    (
        "AllowOverwriteTerminationGracePeriodSeconds",
        Stage::Deprecated,
        false,
        false,
    ),
    (
        "AllowServiceLBStatusOnNonLB",
        Stage::Deprecated,
        false,
        true,
    ),
    ("AnyVolumeDataSource", Stage::GA, true, true),
    ("BtreeWatchCache", Stage::GA, true, true),
    ("CPUManagerPolicyOptions", Stage::GA, true, true),
    ("CRDValidationRatcheting", Stage::GA, true, true),
    ("CSIMigrationPortworx", Stage::GA, true, true),
    ("CronJobsScheduledAnnotation", Stage::GA, true, true),
    ("CustomResourceFieldSelectors", Stage::GA, true, true),
    ("DevicePluginCDIDevices", Stage::GA, true, true),
    (
        "DisableNodeKubeProxyVersion",
        Stage::Deprecated,
        true,
        false,
    ),
    ("ElasticIndexedJob", Stage::GA, true, true),
    ("ExecProbeTimeout", Stage::GA, true, false),
    ("GitRepoVolumeDriver", Stage::Deprecated, false, false),
    ("HonorPVReclaimPolicy", Stage::GA, true, true),
    (
        "InPlacePodVerticalScalingAllocatedStatus",
        Stage::Deprecated,
        false,
        false,
    ),
    ("JobBackoffLimitPerIndex", Stage::GA, true, true),
    ("JobSuccessPolicy", Stage::GA, true, true),
    ("KMSv1", Stage::Deprecated, false, false),
    (
        "KubeletRegistrationGetOnExistsOnly",
        Stage::Deprecated,
        false,
        false,
    ),
    ("LegacySidecarContainers", Stage::Deprecated, false, false),
    ("LoadBalancerIPMode", Stage::GA, true, true),
    ("LogarithmicScaleDown", Stage::GA, true, true),
    ("MatchLabelKeysInPodAffinity", Stage::GA, true, true),
    ("MemoryManager", Stage::GA, true, true),
    ("MultiCIDRServiceAllocator", Stage::GA, true, false),
    ("NFTablesProxyMode", Stage::GA, true, true),
    (
        "NodeInclusionPolicyInPodTopologySpread",
        Stage::GA,
        true,
        true,
    ),
    ("PodDisruptionConditions", Stage::GA, true, true),
    ("PodIndexLabel", Stage::GA, true, true),
    ("PodSchedulingReadiness", Stage::GA, true, true),
    ("RecursiveReadOnlyMounts", Stage::GA, true, true),
    ("RetryGenerateName", Stage::GA, true, true),
    ("SeparateCacheWatchRPC", Stage::Deprecated, false, false),
    ("ServiceAccountTokenJTI", Stage::GA, true, true),
    ("ServiceAccountTokenNodeBinding", Stage::GA, true, true),
    (
        "ServiceAccountTokenNodeBindingValidation",
        Stage::GA,
        true,
        true,
    ),
    ("ServiceAccountTokenPodNodeInfo", Stage::GA, true, true),
    ("ServiceTrafficDistribution", Stage::GA, true, true),
    ("SidecarContainers", Stage::GA, true, true),
    ("SizeMemoryBackedVolumes", Stage::GA, true, true),
    ("StatefulSetAutoDeletePVC", Stage::GA, true, true),
    ("StatefulSetStartOrdinal", Stage::GA, true, true),
    ("StorageNamespaceIndex", Stage::Deprecated, true, false),
    ("StrictCostEnforcementForVAP", Stage::GA, true, true),
    ("StrictCostEnforcementForWebhooks", Stage::GA, true, true),
    (
        "StructuredAuthorizationConfiguration",
        Stage::GA,
        true,
        true,
    ),
    ("TopologyAwareHints", Stage::GA, true, true),
    ("TopologyManagerPolicyOptions", Stage::GA, true, false),
    (
        "WatchFromStorageWithoutResourceVersion",
        Stage::Deprecated,
        false,
        true,
    ),
    ("WindowsHostNetwork", Stage::Deprecated, false, false),
];

/// A known gate: its stage, default, and whether it is locked to that default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GateSpec {
    pub stage: Stage,
    pub default: bool,
    pub locked: bool,
}

pub fn spec(name: &str) -> Option<GateSpec> {
    KNOWN_GATES
        .iter()
        .find(|(n, _, _)| *n == name)
        .map(|(_, stage, default)| GateSpec {
            stage: *stage,
            default: *default,
            locked: false,
        })
        .or_else(|| {
            GRADUATED_GATES
                .iter()
                .find(|(n, ..)| *n == name)
                .map(|(_, stage, default, locked)| GateSpec {
                    stage: *stage,
                    default: *default,
                    locked: *locked,
                })
        })
}

pub fn lookup(name: &str) -> Option<(Stage, bool)> {
    spec(name).map(|s| (s.stage, s.default))
}

/// Go's `strconv.ParseBool`.
pub fn parse_go_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// Parses `--feature-gates` (`A=true,B=false`); errors read like component-base's.
pub fn parse_flag(value: &str) -> Result<BTreeMap<String, bool>, String> {
    let mut out = BTreeMap::new();
    for item in value.split(',') {
        let item = item.trim();
        if item.is_empty() {
            continue;
        }
        let Some((k, v)) = item.split_once('=') else {
            return Err(format!("missing bool value for {item}"));
        };
        let k = k.trim();
        let b = parse_go_bool(v.trim()).ok_or_else(|| {
            format!(
                "invalid value of {k}={v}, err: strconv.ParseBool: parsing {v:?}: invalid syntax"
            )
        })?;
        out.insert(k.to_string(), b);
    }
    Ok(out)
}

/// `SetFromMap` on the default gate set: every key must be known, and a locked gate can only
/// be set to its default. Like upstream, the first problem found is reported.
pub fn check(gates: &BTreeMap<String, bool>) -> Result<(), String> {
    for (name, value) in gates {
        let Some(spec) = spec(name) else {
            return Err(format!("unrecognized feature gate: {name}"));
        };
        if spec.locked && spec.default != *value {
            return Err(format!(
                "cannot set feature gate {name} to {value}, feature is locked to {}",
                spec.default
            ));
        }
    }
    Ok(())
}

/// The warnings `SetFromMap` logs for gates that are set although GA or deprecated.
pub fn warnings(gates: &BTreeMap<String, bool>) -> Vec<String> {
    gates
        .iter()
        .filter_map(|(name, value)| match spec(name)?.stage {
            Stage::GA => Some(format!(
                "Setting GA feature gate {name}={value}. It will be removed in a future release."
            )),
            Stage::Deprecated => Some(format!(
                "Setting deprecated feature gate {name}={value}. It will be removed in a future release."
            )),
            Stage::Alpha | Stage::Beta => None,
        })
        .collect()
}

/// Effective value of a gate after the overrides (AllAlpha / AllBeta honoured).
pub fn enabled(gates: &BTreeMap<String, bool>, name: &str) -> bool {
    if let Some(v) = gates.get(name) {
        return *v;
    }
    match lookup(name) {
        Some((Stage::Alpha, d)) => gates.get("AllAlpha").copied().unwrap_or(d),
        Some((Stage::Beta, d)) => gates.get("AllBeta").copied().unwrap_or(d),
        Some((Stage::GA | Stage::Deprecated, d)) => d,
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flag_parsing() {
        let m = parse_flag("LoggingAlphaOptions=true, AllBeta=False").unwrap();
        assert_eq!(m.get("LoggingAlphaOptions"), Some(&true));
        assert_eq!(m.get("AllBeta"), Some(&false));
        assert_eq!(parse_flag("Foo").unwrap_err(), "missing bool value for Foo");
        assert!(
            parse_flag("Foo=maybe")
                .unwrap_err()
                .contains("invalid value of Foo=maybe")
        );
        assert!(check(&m).is_ok());
        assert_eq!(
            check(&parse_flag("NoSuchGate=true").unwrap()).unwrap_err(),
            "unrecognized feature gate: NoSuchGate"
        );
        assert!(!enabled(&BTreeMap::new(), "LoggingAlphaOptions"));
        assert!(enabled(&m, "LoggingAlphaOptions"));
        assert!(enabled(&BTreeMap::new(), "LoggingBetaOptions"));
        assert!(
            !enabled(&m, "LoggingBetaOptions"),
            "AllBeta=false overrides beta defaults"
        );
    }
}
