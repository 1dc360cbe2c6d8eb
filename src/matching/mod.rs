//! What routes and rate-limit rules match on: the normalized path, path globs, hosts and
//! methods. One implementation, shared by routing and by the limiter, so that no spelling of
//! a path can reach a route while dodging a rule written for it.

pub mod glob;
pub mod host;
pub mod methods;
pub mod normalize;

pub use glob::{PathPattern, Segments};
pub use host::HostMatch;
pub use methods::MethodSet;
pub use normalize::normalize_path;

/// What a route and a rate-limit rule both match a request on: its method, its host (when
/// given) and its normalized path. One type, so that a route and a rule written alike match
/// alike.
#[derive(Debug)]
pub struct RequestMatch {
    pub methods: MethodSet,
    pub host: Option<HostMatch>,
    pub path: PathPattern,
}

impl RequestMatch {
    /// Does a request with this method, `Host` (if any) and split normalized path match?
    pub fn matches(&self, method: &http::Method, host: Option<&str>, path: &Segments) -> bool {
        self.methods.contains(method)
            && match (&self.host, host) {
                (None, _) => true,
                (Some(h), Some(request_host)) => h.matches(request_host),
                (Some(_), None) => false,
            }
            && self.path.matches_segments(path)
    }

    /// Could one request match both? (A rule no route's matcher overlaps is never applied: `-t`
    /// warns.) Errs towards yes.
    pub fn overlaps(&self, other: &RequestMatch) -> bool {
        self.methods.overlaps(other.methods)
            && match (&self.host, &other.host) {
                (Some(a), Some(b)) => a.overlaps(b),
                _ => true,
            }
            && self.path.overlaps(&other.path)
    }

    /// `GET,PUT api.example.com /v1/**` (methods `*` for all), as `-t` shows it.
    pub fn describe(&self) -> String {
        let methods = if self.methods.is_all() {
            "*".to_string()
        } else {
            self.methods.names().join(",")
        };
        match &self.host {
            Some(h) => format!("{methods} {} {}", h.as_display(), self.path.as_str()),
            None => format!("{methods} {}", self.path.as_str()),
        }
    }
}
