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
