//! The images a node agent can run. No image is pulled: an image names programs built from
//! this workspace or installed on the machine, with the ENTRYPOINT, CMD, ENV, USER and
//! WORKDIR its Dockerfile gives.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// One image: its configuration and where its programs are on the host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Image {
    /// `ENTRYPOINT`, exec form.
    pub entrypoint: Vec<String>,
    /// `CMD`, exec form.
    pub cmd: Vec<String>,
    /// `ENV`, in order (`PATH` decides where bare command names are looked up).
    pub env: Vec<(String, String)>,
    /// `USER` as uid and gid.
    pub uid: u32,
    /// The `USER`'s group.
    pub gid: u32,
    /// `WORKDIR`.
    pub working_dir: PathBuf,
    /// Its programs.
    pub programs: Programs,
}

/// How an image's paths map to programs on the host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Programs {
    /// Each in-image path to a host program (e.g. `/usr/local/bin/shardwise-controller` to
    /// the workspace's build of it).
    Files(BTreeMap<PathBuf, PathBuf>),
    /// A multi-call binary: every path whose file name is one of `applets`, in any directory
    /// of the image, runs `program` with that name as `argv[0]` (busybox).
    MultiCall {
        /// The host binary.
        program: PathBuf,
        /// The names it answers to.
        applets: Vec<String>,
    },
}

impl Image {
    /// The value of `name` in the image's `ENV`.
    pub fn env_value(&self, name: &str) -> Option<&str> {
        self.env
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The host program for `command` (an absolute in-image path, or a bare name looked up
    /// in the image's `PATH`) and the `argv[0]` it is to be given.
    pub fn resolve(&self, command: &str) -> Option<(PathBuf, String)> {
        let candidates: Vec<PathBuf> = if command.contains('/') {
            vec![PathBuf::from(command)]
        } else {
            self.env_value("PATH")
                .unwrap_or_default()
                .split(':')
                .filter(|dir| !dir.is_empty())
                .map(|dir| Path::new(dir).join(command))
                .collect()
        };
        candidates.iter().find_map(|path| match &self.programs {
            Programs::Files(files) => files
                .get(path)
                .map(|host| (host.clone(), command.to_string())),
            Programs::MultiCall { program, applets } => {
                let name = path.file_name()?.to_str()?;
                applets
                    .iter()
                    .any(|a| a == name)
                    .then(|| (program.clone(), name.to_string()))
            }
        })
    }
}

/// The images a node agent knows, by repository; any tag or digest of a repository is the
/// same image (they all map to the one build at hand).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ImageTable {
    images: BTreeMap<String, Image>,
}

impl ImageTable {
    /// Adds (or replaces) the image of `repository`, e.g. `ghcr.io/shardwise/shardwise`.
    pub fn insert(&mut self, repository: impl Into<String>, image: Image) {
        self.images.insert(repository.into(), image);
    }

    /// The image a pod's `image` field names, without its tag or digest.
    pub fn get(&self, reference: &str) -> Option<&Image> {
        self.images.get(repository(reference))
    }

    /// The repositories it knows, for error messages.
    pub fn repositories(&self) -> impl Iterator<Item = &str> {
        self.images.keys().map(String::as_str)
    }
}

/// `reference` without `@digest` and `:tag` (a colon before the last `/` is a registry port).
pub fn repository(reference: &str) -> &str {
    let name = reference
        .split_once('@')
        .map_or(reference, |(name, _)| name);
    match name.rfind(':') {
        Some(colon) if !name[colon..].contains('/') => &name[..colon],
        _ => name,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shardwise() -> Image {
        Image {
            entrypoint: vec!["/usr/local/bin/shardwise-controller".into()],
            cmd: Vec::new(),
            env: vec![("PATH".into(), "/usr/local/bin:/usr/bin".into())],
            uid: 65532,
            gid: 65532,
            working_dir: "/".into(),
            programs: Programs::Files(BTreeMap::from([(
                PathBuf::from("/usr/local/bin/shardwise-controller"),
                PathBuf::from("/build/shardwise-controller"),
            )])),
        }
    }

    #[test]
    fn references_name_their_repository_whatever_the_tag_digest_or_registry_port() {
        assert_eq!(
            repository("ghcr.io/shardwise/shardwise:0.1.0"),
            "ghcr.io/shardwise/shardwise"
        );
        assert_eq!(repository("busybox"), "busybox");
        assert_eq!(repository("busybox:1.37@sha256:abc"), "busybox");
        assert_eq!(
            repository("registry:5000/team/app"),
            "registry:5000/team/app"
        );
        assert_eq!(
            repository("registry:5000/team/app:v2"),
            "registry:5000/team/app"
        );
    }

    #[test]
    fn commands_resolve_by_absolute_path_or_through_the_image_path() {
        let image = shardwise();
        let expected = Some((
            PathBuf::from("/build/shardwise-controller"),
            "shardwise-controller".to_string(),
        ));
        assert_eq!(image.resolve("shardwise-controller"), expected);
        assert_eq!(
            image.resolve("/usr/local/bin/shardwise-controller"),
            Some((
                PathBuf::from("/build/shardwise-controller"),
                "/usr/local/bin/shardwise-controller".to_string()
            ))
        );
        assert_eq!(image.resolve("/usr/bin/shardwise-controller"), None);
        assert_eq!(image.resolve("sh"), None);
    }

    #[test]
    fn a_multi_call_image_runs_each_applet_under_its_name() {
        let image = Image {
            programs: Programs::MultiCall {
                program: "/usr/bin/busybox".into(),
                applets: vec!["sh".into(), "wget".into()],
            },
            env: vec![("PATH".into(), "/bin".into())],
            ..shardwise()
        };
        assert_eq!(
            image.resolve("sh"),
            Some(("/usr/bin/busybox".into(), "sh".into()))
        );
        assert_eq!(
            image.resolve("/bin/wget"),
            Some(("/usr/bin/busybox".into(), "wget".into()))
        );
        assert_eq!(image.resolve("curl"), None);
    }
}
