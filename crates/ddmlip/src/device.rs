//! Where an evaluation runs: the CPU engine or a CUDA GPU.

use std::str::FromStr;

/// Where a command or a calculator evaluates: `cpu`, `cuda` (device 0) or
/// `cuda:N`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    /// The CPU (every model).
    Cpu,
    /// CUDA device N.
    Cuda(usize),
}

impl FromStr for Device {
    type Err = String;

    /// Parses `cpu`, `cuda` or `cuda:N`; the error names the text and the
    /// accepted forms.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || format!("`{s}`: expected cpu, cuda or cuda:N (N = device index)");
        match s {
            "cpu" => Ok(Self::Cpu),
            "cuda" => Ok(Self::Cuda(0)),
            _ => s
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(Self::Cuda)
                .ok_or_else(bad),
        }
    }
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Cpu => write!(f, "cpu"),
            Self::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Device;

    #[test]
    fn names_round_trip_and_bad_ones_are_refused() {
        for d in [Device::Cpu, Device::Cuda(0), Device::Cuda(3)] {
            assert_eq!(d.to_string().parse::<Device>(), Ok(d));
        }
        assert_eq!("cuda".parse::<Device>(), Ok(Device::Cuda(0)));
        for bad in ["gpu", "cuda:", "cuda:x", "cuda:-1", "CPU", ""] {
            let err = bad.parse::<Device>().unwrap_err();
            assert!(err.contains("expected cpu, cuda or cuda:N"), "{bad}: {err}");
        }
    }
}
