//! Parsing of protocol, group and signature names given on the command line,
//! with errors that list what is accepted.

use anyhow::{Context, Result};
use conclave_gka::{GroupId, ProtocolId, SignatureId};

/// Parses a list of protocol names.
pub fn protocols(names: &[String]) -> Result<Vec<ProtocolId>> {
    names
        .iter()
        .map(|s| ProtocolId::from_name(s).with_context(|| format!("unknown protocol {s:?} (gdh, ckd, tgdh, str, bd)")))
        .collect()
}

/// Parses a group name.
pub fn group(name: &str) -> Result<GroupId> {
    GroupId::from_name(name)
        .with_context(|| format!("unknown group {name:?} (ristretto255, modp512, modp1024, modp2048)"))
}

/// Parses a signature scheme name.
pub fn signature(name: &str) -> Result<SignatureId> {
    SignatureId::from_name(name).with_context(|| {
        let all: Vec<String> = SignatureId::ALL.iter().map(|s| s.name()).collect();
        format!("unknown signature scheme {name:?} ({})", all.join(", "))
    })
}
