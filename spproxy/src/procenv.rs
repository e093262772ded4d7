//! SIGMACONFIG: the proc's ProcEnv as Go `encoding/json` of `proc.ProcEnv`.
//!
//! Keys are the proto field names; `spawnTimePB` is `{"seconds":N,"nanos":M}` (Go's
//! struct form, which protojson would reject), so this is a plain serde mapping with
//! every key spelled out, not protobuf-JSON. Unknown keys are ignored so a newer σOS
//! adding fields does not break an older client.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::proto::{ProcEnvProto, SecretProto, Taddr, TendpointProto, Timestamp, Tprincipal};

/// Name of the environment variable holding the proc's ProcEnv.
pub const SIGMACONFIG: &str = "SIGMACONFIG";

#[derive(thiserror::Error, Debug)]
pub enum ProcEnvError {
    #[error("SIGMACONFIG is not a valid ProcEnv JSON: {0}")]
    Json(#[from] serde_json::Error),
}

fn is_default<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}

#[derive(Serialize, Deserialize, Default)]
#[serde(default)]
struct JAddr {
    #[serde(rename = "iPStr", skip_serializing_if = "is_default")]
    ip_str: String,
    #[serde(rename = "portInt", skip_serializing_if = "is_default")]
    port_int: u32,
}

#[derive(Serialize, Deserialize, Default)]
#[serde(default)]
struct JEndpoint {
    #[serde(rename = "type", skip_serializing_if = "is_default")]
    type_: u32,
    #[serde(rename = "addr", skip_serializing_if = "Vec::is_empty")]
    addr: Vec<JAddr>,
    #[serde(rename = "root", skip_serializing_if = "is_default")]
    root: String,
}

#[derive(Serialize, Deserialize, Default)]
#[serde(default)]
struct JPrincipal {
    #[serde(rename = "iDStr", skip_serializing_if = "is_default")]
    id_str: String,
    #[serde(rename = "realmStr", skip_serializing_if = "is_default")]
    realm_str: String,
}

#[derive(Serialize, Deserialize, Default)]
#[serde(default)]
struct JSecret {
    #[serde(rename = "iD", skip_serializing_if = "is_default")]
    id: String,
    #[serde(rename = "key", skip_serializing_if = "is_default")]
    key: String,
    #[serde(rename = "metadata", skip_serializing_if = "is_default")]
    metadata: String,
}

#[derive(Serialize, Deserialize, Default)]
#[serde(default)]
struct JTimestamp {
    #[serde(skip_serializing_if = "is_default")]
    seconds: i64,
    #[serde(skip_serializing_if = "is_default")]
    nanos: i32,
}

/// Field order = proto field order = Go struct order, so serializing reproduces Go's output.
#[derive(Serialize, Deserialize, Default)]
#[serde(default)]
struct JProcEnv {
    #[serde(rename = "pidStr", skip_serializing_if = "is_default")]
    pid_str: String,
    #[serde(rename = "program", skip_serializing_if = "is_default")]
    program: String,
    #[serde(rename = "realmStr", skip_serializing_if = "is_default")]
    realm_str: String,
    #[serde(rename = "principal", skip_serializing_if = "Option::is_none")]
    principal: Option<JPrincipal>,
    #[serde(rename = "procDir", skip_serializing_if = "is_default")]
    proc_dir: String,
    #[serde(rename = "parentDir", skip_serializing_if = "is_default")]
    parent_dir: String,
    #[serde(rename = "etcdEndpoints", skip_serializing_if = "BTreeMap::is_empty")]
    etcd_endpoints: BTreeMap<String, JEndpoint>,
    #[serde(rename = "outerContainerIPStr", skip_serializing_if = "is_default")]
    outer_container_ip_str: String,
    #[serde(rename = "innerContainerIPStr", skip_serializing_if = "is_default")]
    inner_container_ip_str: String,
    #[serde(rename = "kernelID", skip_serializing_if = "is_default")]
    kernel_id: String,
    #[serde(rename = "buildTag", skip_serializing_if = "is_default")]
    build_tag: String,
    #[serde(rename = "perf", skip_serializing_if = "is_default")]
    perf: String,
    #[serde(rename = "debug", skip_serializing_if = "is_default")]
    debug: String,
    #[serde(rename = "procdPIDStr", skip_serializing_if = "is_default")]
    procd_pid_str: String,
    #[serde(rename = "privileged", skip_serializing_if = "is_default")]
    privileged: bool,
    #[serde(rename = "howInt", skip_serializing_if = "is_default")]
    how_int: i32,
    #[serde(rename = "spawnTimePB", skip_serializing_if = "Option::is_none")]
    spawn_time_pb: Option<JTimestamp>,
    #[serde(rename = "strace", skip_serializing_if = "is_default")]
    strace: String,
    #[serde(rename = "useSPProxy", skip_serializing_if = "is_default")]
    use_sp_proxy: bool,
    #[serde(rename = "useDialProxy", skip_serializing_if = "is_default")]
    use_dial_proxy: bool,
    #[serde(rename = "secretsMap", skip_serializing_if = "BTreeMap::is_empty")]
    secrets_map: BTreeMap<String, JSecret>,
    #[serde(rename = "sigmaPath", skip_serializing_if = "Vec::is_empty")]
    sigma_path: Vec<String>,
    #[serde(rename = "kernels", skip_serializing_if = "Vec::is_empty")]
    kernels: Vec<String>,
    #[serde(rename = "realmSwitchStr", skip_serializing_if = "is_default")]
    realm_switch_str: String,
    #[serde(rename = "version", skip_serializing_if = "is_default")]
    version: String,
    #[serde(rename = "fail", skip_serializing_if = "is_default")]
    fail: String,
    #[serde(rename = "cachedEndpoints", skip_serializing_if = "BTreeMap::is_empty")]
    cached_endpoints: BTreeMap<String, JEndpoint>,
    #[serde(rename = "valgrind", skip_serializing_if = "is_default")]
    valgrind: String,
    #[serde(rename = "runBootScriptFlag", skip_serializing_if = "is_default")]
    run_boot_script_flag: bool,
    #[serde(rename = "useShmem", skip_serializing_if = "is_default")]
    use_shmem: bool,
    #[serde(rename = "useSPProxyProcClnt", skip_serializing_if = "is_default")]
    use_sp_proxy_proc_clnt: bool,
    #[serde(rename = "debugProcs", skip_serializing_if = "is_default")]
    debug_procs: String,
}

fn endpoint_from(j: JEndpoint) -> TendpointProto {
    TendpointProto {
        r#type: j.type_,
        addr: j
            .addr
            .into_iter()
            .map(|a| Taddr {
                i_p_str: a.ip_str,
                port_int: a.port_int,
            })
            .collect(),
        root: j.root,
    }
}

fn endpoint_to(p: &TendpointProto) -> JEndpoint {
    JEndpoint {
        type_: p.r#type,
        addr: p
            .addr
            .iter()
            .map(|a| JAddr {
                ip_str: a.i_p_str.clone(),
                port_int: a.port_int,
            })
            .collect(),
        root: p.root.clone(),
    }
}

/// Parses the value of SIGMACONFIG.
pub fn from_json(s: &str) -> Result<ProcEnvProto, ProcEnvError> {
    let j: JProcEnv = serde_json::from_str(s)?;
    Ok(ProcEnvProto {
        pid_str: j.pid_str,
        program: j.program,
        realm_str: j.realm_str,
        principal: j.principal.map(|p| Tprincipal {
            i_d_str: p.id_str,
            realm_str: p.realm_str,
        }),
        proc_dir: j.proc_dir,
        parent_dir: j.parent_dir,
        etcd_endpoints: j
            .etcd_endpoints
            .into_iter()
            .map(|(k, v)| (k, endpoint_from(v)))
            .collect(),
        outer_container_ip_str: j.outer_container_ip_str,
        inner_container_ip_str: j.inner_container_ip_str,
        kernel_id: j.kernel_id,
        build_tag: j.build_tag,
        perf: j.perf,
        debug: j.debug,
        procd_pid_str: j.procd_pid_str,
        privileged: j.privileged,
        how_int: j.how_int,
        spawn_time_pb: j.spawn_time_pb.map(|t| Timestamp {
            seconds: t.seconds,
            nanos: t.nanos,
        }),
        strace: j.strace,
        use_sp_proxy: j.use_sp_proxy,
        use_dial_proxy: j.use_dial_proxy,
        secrets_map: j
            .secrets_map
            .into_iter()
            .map(|(k, v)| {
                (
                    k,
                    SecretProto {
                        i_d: v.id,
                        key: v.key,
                        metadata: v.metadata,
                    },
                )
            })
            .collect(),
        sigma_path: j.sigma_path,
        kernels: j.kernels,
        realm_switch_str: j.realm_switch_str,
        version: j.version,
        fail: j.fail,
        cached_endpoints: j
            .cached_endpoints
            .into_iter()
            .map(|(k, v)| (k, endpoint_from(v)))
            .collect(),
        valgrind: j.valgrind,
        run_boot_script_flag: j.run_boot_script_flag,
        use_shmem: j.use_shmem,
        use_sp_proxy_proc_clnt: j.use_sp_proxy_proc_clnt,
        debug_procs: j.debug_procs,
    })
}

/// Serializes a ProcEnv the way Go's `encoding/json` does (omitempty fields, proto order),
/// for handing to a child as SIGMACONFIG.
pub fn to_json(p: &ProcEnvProto) -> String {
    let j = JProcEnv {
        pid_str: p.pid_str.clone(),
        program: p.program.clone(),
        realm_str: p.realm_str.clone(),
        principal: p.principal.as_ref().map(|p| JPrincipal {
            id_str: p.i_d_str.clone(),
            realm_str: p.realm_str.clone(),
        }),
        proc_dir: p.proc_dir.clone(),
        parent_dir: p.parent_dir.clone(),
        etcd_endpoints: p
            .etcd_endpoints
            .iter()
            .map(|(k, v)| (k.clone(), endpoint_to(v)))
            .collect(),
        outer_container_ip_str: p.outer_container_ip_str.clone(),
        inner_container_ip_str: p.inner_container_ip_str.clone(),
        kernel_id: p.kernel_id.clone(),
        build_tag: p.build_tag.clone(),
        perf: p.perf.clone(),
        debug: p.debug.clone(),
        procd_pid_str: p.procd_pid_str.clone(),
        privileged: p.privileged,
        how_int: p.how_int,
        spawn_time_pb: p.spawn_time_pb.as_ref().map(|t| JTimestamp {
            seconds: t.seconds,
            nanos: t.nanos,
        }),
        strace: p.strace.clone(),
        use_sp_proxy: p.use_sp_proxy,
        use_dial_proxy: p.use_dial_proxy,
        secrets_map: p
            .secrets_map
            .iter()
            .map(|(k, v)| {
                (
                    k.clone(),
                    JSecret {
                        id: v.i_d.clone(),
                        key: v.key.clone(),
                        metadata: v.metadata.clone(),
                    },
                )
            })
            .collect(),
        sigma_path: p.sigma_path.clone(),
        kernels: p.kernels.clone(),
        realm_switch_str: p.realm_switch_str.clone(),
        version: p.version.clone(),
        fail: p.fail.clone(),
        cached_endpoints: p
            .cached_endpoints
            .iter()
            .map(|(k, v)| (k.clone(), endpoint_to(v)))
            .collect(),
        valgrind: p.valgrind.clone(),
        run_boot_script_flag: p.run_boot_script_flag,
        use_shmem: p.use_shmem,
        use_sp_proxy_proc_clnt: p.use_sp_proxy_proc_clnt,
        debug_procs: p.debug_procs.clone(),
    };
    serde_json::to_string(&j).expect("ProcEnv JSON serialization cannot fail")
}

/// A minimal ProcEnv for a proc started without SIGMACONFIG: pid, program, realm and
/// principal set, spproxy and its proc client enabled, spawn time now.
pub fn minimal(pid: &str, program: &str, realm: &str) -> ProcEnvProto {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    ProcEnvProto {
        pid_str: pid.to_owned(),
        program: program.to_owned(),
        realm_str: realm.to_owned(),
        principal: Some(Tprincipal {
            i_d_str: pid.to_owned(),
            realm_str: realm.to_owned(),
        }),
        spawn_time_pb: Some(Timestamp {
            seconds: i64::try_from(now.as_secs()).unwrap_or(i64::MAX),
            nanos: i32::try_from(now.subsec_nanos()).unwrap_or(0),
        }),
        use_sp_proxy: true,
        use_sp_proxy_proc_clnt: true,
        realm_switch_str: "NOT_SET".to_owned(),
        ..ProcEnvProto::default()
    }
}
