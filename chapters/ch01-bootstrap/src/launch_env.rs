//! What torchrun tells each process, read and checked in one place.
//!
//! torchrun starts one process per GPU and describes the job through environment variables.
//! Everything after this module works from a [`LaunchEnv`], never from the environment, so
//! that tests and the Python package can build one by hand.

use std::time::Duration;

use sha2::{Digest, Sha256};

/// Environment variable that fixes the rendezvous port (default: the first free one of
/// `MASTER_PORT + 1 ..` [`RDZV_PORT_WINDOW`] ports).
pub const RDZV_PORT_VAR: &str = "NVSHMEM_TUTORIAL_RDZV_PORT";
/// Ports the default rendezvous may use, from `MASTER_PORT + 1`: a port of the window can be
/// held by some other socket of the host (an outgoing connection's ephemeral port, say), so
/// rank 0 takes the first it can bind and the others look for it along the same window.
pub const RDZV_PORT_WINDOW: u16 = 16;
/// Environment variable that bounds every wait of the bootstrap, in milliseconds.
pub const TIMEOUT_VAR: &str = "NVSHMEM_TUTORIAL_TIMEOUT_MS";
/// Default bound on every bootstrap wait.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

const LAUNCH_HINT: &str = "launch with `torchrun --nproc_per_node=N --no-python <binary>`, or set \
                           RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT yourself";

/// A variable that is missing or does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvError {
    #[error("{0} is not set: {LAUNCH_HINT}")]
    Missing(&'static str),
    #[error("{name}={value:?} is not {expected}")]
    Malformed {
        name: &'static str,
        value: String,
        expected: &'static str,
    },
    #[error("RANK={rank} is out of range for WORLD_SIZE={world_size} (ranks are 0..{world_size})")]
    RankOutOfRange { rank: usize, world_size: usize },
    #[error("LOCAL_RANK={local_rank} is out of range for LOCAL_WORLD_SIZE={local_world_size}")]
    LocalRankOutOfRange {
        local_rank: usize,
        local_world_size: usize,
    },
    #[error("MASTER_PORT={0} + 1 is past 65535: set {RDZV_PORT_VAR} to a free port")]
    PortOverflow(u16),
}

// ANCHOR: launch_env
/// One process's place in the job, as torchrun describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchEnv {
    /// Global rank: becomes this process's NVSHMEM PE number.
    pub rank: usize,
    pub world_size: usize,
    /// Rank on this host: selects the GPU (`cuda:LOCAL_RANK`).
    pub local_rank: usize,
    pub local_world_size: usize,
    /// Host of rank 0, where the unique id is served.
    pub master_addr: String,
    /// First port of our own rendezvous (torchrun's store already owns MASTER_PORT), and how
    /// many ports from it rank 0 may bind (1 when NVSHMEM_TUTORIAL_RDZV_PORT fixes it).
    pub rdzv_port: u16,
    pub rdzv_ports: u16,
    /// The job's shared secret: every rank of this job derives the same one from
    /// TORCHELASTIC_RUN_ID (torchrun's job id), MASTER_ADDR and MASTER_PORT, and the
    /// rendezvous proves it both ways without sending it ([`JobToken`]).
    pub job_token: JobToken,
    /// Bound on every wait of the bootstrap.
    pub timeout: Duration,
}
// ANCHOR_END: launch_env

impl LaunchEnv {
    /// Reads the process environment.
    pub fn from_env() -> Result<Self, EnvError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Reads variables through `lookup` (the environment, or a map in tests).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, EnvError> {
        let required = |name: &'static str| lookup(name).ok_or(EnvError::Missing(name));
        let rank = parse_usize("RANK", &required("RANK")?)?;
        let world_size = parse_usize("WORLD_SIZE", &required("WORLD_SIZE")?)?;
        if world_size == 0 {
            return Err(EnvError::Malformed {
                name: "WORLD_SIZE",
                value: "0".into(),
                expected: "a positive integer",
            });
        }
        if rank >= world_size {
            return Err(EnvError::RankOutOfRange { rank, world_size });
        }
        let master_addr = required("MASTER_ADDR")?;
        if master_addr.trim().is_empty() {
            return Err(EnvError::Malformed {
                name: "MASTER_ADDR",
                value: master_addr,
                expected: "a host name or IP address",
            });
        }
        let master_port = parse_port("MASTER_PORT", &required("MASTER_PORT")?)?;
        // Without LOCAL_* the job is taken to be on one host, one GPU per rank.
        let local_rank = match lookup("LOCAL_RANK") {
            Some(v) => parse_usize("LOCAL_RANK", &v)?,
            None => rank,
        };
        let local_world_size = match lookup("LOCAL_WORLD_SIZE") {
            Some(v) => parse_usize("LOCAL_WORLD_SIZE", &v)?,
            None => world_size,
        };
        if local_rank >= local_world_size {
            return Err(EnvError::LocalRankOutOfRange {
                local_rank,
                local_world_size,
            });
        }
        let (rdzv_port, rdzv_ports) = match lookup(RDZV_PORT_VAR) {
            Some(v) => (parse_port(RDZV_PORT_VAR, &v)?, 1),
            None => {
                let first = master_port
                    .checked_add(1)
                    .ok_or(EnvError::PortOverflow(master_port))?;
                (first, RDZV_PORT_WINDOW.min(u16::MAX - first + 1))
            }
        };
        let run_id = lookup("TORCHELASTIC_RUN_ID").unwrap_or_default();
        // Not WORLD_SIZE: ranks of one job that disagree on it must meet, and fail loudly.
        let job_token = JobToken::derive(&run_id, &master_addr, master_port);
        let timeout = match lookup(TIMEOUT_VAR) {
            Some(v) => {
                let ms = parse_usize(TIMEOUT_VAR, &v)?;
                if ms == 0 {
                    return Err(EnvError::Malformed {
                        name: TIMEOUT_VAR,
                        value: v,
                        expected: "a positive number of milliseconds",
                    });
                }
                Duration::from_millis(ms as u64)
            }
            None => DEFAULT_TIMEOUT,
        };
        Ok(Self {
            rank,
            world_size,
            local_rank,
            local_world_size,
            master_addr,
            rdzv_port,
            rdzv_ports,
            job_token,
            timeout,
        })
    }
}

fn parse_usize(name: &'static str, value: &str) -> Result<usize, EnvError> {
    value.trim().parse().map_err(|_| EnvError::Malformed {
        name,
        value: value.into(),
        expected: "a non-negative integer",
    })
}

/// The secret that the ranks of one job share: SHA-256 of TORCHELASTIC_RUN_ID, MASTER_ADDR and
/// MASTER_PORT, which every rank computes alike whatever binary or build it runs.
///
/// It is as secret as its inputs. MASTER_ADDR and MASTER_PORT can be guessed, so what a process
/// outside the job lacks is the run id: `torchrun --standalone` makes it a random UUID, and
/// `--rdzv-id` sets it otherwise (give it a value no one else can guess, such as a scheduler's
/// job id plus a random suffix). A process that has the job's environment has the token, and
/// is trusted like any rank: torchrun's own store trusts it too.
///
/// `Debug` prints no bytes of it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct JobToken([u8; 32]);

impl JobToken {
    /// The token of the job that torchrun describes with these three values.
    pub fn derive(run_id: &str, master_addr: &str, master_port: u16) -> Self {
        let mut hash = Sha256::new();
        hash.update(b"nvshmem-tutorial rendezvous job token\0");
        // Each field with its length, so that no two triples hash the same bytes.
        for field in [run_id.as_bytes(), master_addr.as_bytes()] {
            hash.update((field.len() as u64).to_le_bytes());
            hash.update(field);
        }
        hash.update(master_port.to_le_bytes());
        Self(hash.finalize().into())
    }

    /// The key of the rendezvous's HMAC.
    pub(crate) fn key(&self) -> &[u8] {
        &self.0
    }
}

impl std::fmt::Debug for JobToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JobToken(..)")
    }
}

fn parse_port(name: &'static str, value: &str) -> Result<u16, EnvError> {
    match value.trim().parse::<u16>() {
        Ok(port) if port > 0 => Ok(port),
        _ => Err(EnvError::Malformed {
            name,
            value: value.into(),
            expected: "a TCP port (1..=65535)",
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| map.get(name).cloned()
    }

    const GOOD: &[(&str, &str)] = &[
        ("RANK", "1"),
        ("WORLD_SIZE", "4"),
        ("LOCAL_RANK", "1"),
        ("LOCAL_WORLD_SIZE", "2"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", "29500"),
    ];

    fn with(overrides: &[(&str, Option<&str>)]) -> Result<LaunchEnv, EnvError> {
        let mut pairs: Vec<(&str, &str)> = GOOD.to_vec();
        for (name, value) in overrides {
            pairs.retain(|(k, _)| k != name);
            if let Some(v) = value {
                pairs.push((name, v));
            }
        }
        LaunchEnv::from_lookup(env_of(&pairs))
    }

    #[test]
    fn torchrun_environment_parses() {
        let env = with(&[]).unwrap();
        assert_eq!(
            (
                env.rank,
                env.world_size,
                env.local_rank,
                env.local_world_size
            ),
            (1, 4, 1, 2)
        );
        assert_eq!((env.rdzv_port, env.rdzv_ports), (29501, RDZV_PORT_WINDOW));
        assert_eq!(env.timeout, DEFAULT_TIMEOUT);
    }

    #[test]
    fn each_missing_variable_is_named_with_the_fix() {
        for name in ["RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"] {
            let err = with(&[(name, None)]).unwrap_err();
            assert_eq!(err, EnvError::Missing(name));
            assert!(err.to_string().contains("torchrun"), "{err}");
        }
    }

    #[test]
    fn malformed_values_are_rejected_with_the_value_quoted() {
        let cases: &[(&str, &str)] = &[
            ("RANK", "one"),
            ("RANK", "-1"),
            ("WORLD_SIZE", "0"),
            ("MASTER_PORT", "70000"),
            ("MASTER_PORT", "0"),
            ("MASTER_ADDR", " "),
            (TIMEOUT_VAR, "0"),
            (TIMEOUT_VAR, "soon"),
            (RDZV_PORT_VAR, "http"),
        ];
        for (name, value) in cases {
            let err = with(&[(name, Some(value))]).unwrap_err();
            assert!(
                matches!(&err, EnvError::Malformed { name: n, .. } if n == name),
                "{name}={value}: {err}"
            );
            assert!(err.to_string().contains(name), "{err}");
        }
    }

    #[test]
    fn rank_past_world_size_is_an_error() {
        let err = with(&[("RANK", Some("4"))]).unwrap_err();
        assert_eq!(
            err,
            EnvError::RankOutOfRange {
                rank: 4,
                world_size: 4
            }
        );
        let err = with(&[("LOCAL_RANK", Some("2"))]).unwrap_err();
        assert!(matches!(err, EnvError::LocalRankOutOfRange { .. }), "{err}");
    }

    #[test]
    fn overrides_and_defaults() {
        let env = with(&[(RDZV_PORT_VAR, Some("40000")), (TIMEOUT_VAR, Some("1500"))]).unwrap();
        assert_eq!((env.rdzv_port, env.rdzv_ports), (40000, 1));
        assert_eq!(env.timeout, Duration::from_millis(1500));
        let env = with(&[("LOCAL_RANK", None), ("LOCAL_WORLD_SIZE", None)]).unwrap();
        assert_eq!((env.local_rank, env.local_world_size), (1, 4));
        let err = with(&[("MASTER_PORT", Some("65535"))]).unwrap_err();
        assert_eq!(err, EnvError::PortOverflow(65535));
        // The window stops at the last port.
        let env = with(&[("MASTER_PORT", Some("65530"))]).unwrap();
        assert_eq!((env.rdzv_port, env.rdzv_ports), (65531, 5));
    }

    #[test]
    fn the_job_token_tells_jobs_apart_and_ranks_of_one_job_agree() {
        let a = with(&[("TORCHELASTIC_RUN_ID", Some("run-a"))]).unwrap();
        let same_job_other_rank = with(&[
            ("TORCHELASTIC_RUN_ID", Some("run-a")),
            ("RANK", Some("3")),
            ("LOCAL_RANK", Some("0")),
        ])
        .unwrap();
        assert_eq!(a.job_token, same_job_other_rank.job_token);
        let b = with(&[("TORCHELASTIC_RUN_ID", Some("run-b"))]).unwrap();
        assert_ne!(a.job_token, b.job_token);
        let other_port = with(&[
            ("TORCHELASTIC_RUN_ID", Some("run-a")),
            ("MASTER_PORT", Some("29510")),
        ])
        .unwrap();
        assert_ne!(a.job_token, other_port.job_token);
        // Fields are kept apart: moving a character from one to the next is another job.
        assert_ne!(
            JobToken::derive("run-a1", "27.0.0.1", 29500),
            JobToken::derive("run-a", "127.0.0.1", 29500)
        );
    }

    #[test]
    fn the_job_token_is_not_printed() {
        let env = with(&[("TORCHELASTIC_RUN_ID", Some("run-a"))]).unwrap();
        let printed = format!("{env:?}");
        assert!(printed.contains("job_token: JobToken(..)"), "{printed}");
    }
}
