//! Route matching: the first route whose method, host and path match wins.

use crate::config::model::Route;
use crate::matching::Segments;
use http::Method;

/// Find the route for a request: `path` is the normalized path, split; `host` the request's Host.
pub fn find_route<'a>(
    routes: &'a [Route],
    method: &Method,
    host: Option<&str>,
    path: &Segments,
) -> Option<(usize, &'a Route)> {
    routes
        .iter()
        .enumerate()
        .find(|(_, r)| r.matcher.matches(method, host, path))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matching::{HostMatch, MethodSet, PathPattern, RequestMatch};

    fn route(id: &str, host: Option<&str>, path: &str, methods: Option<&[&str]>) -> Route {
        Route {
            id: id.into(),
            matcher: RequestMatch {
                host: host.map(|h| HostMatch::parse(h).unwrap()),
                path: PathPattern::compile(path).unwrap(),
                methods: methods.map_or(MethodSet::ALL, |m| MethodSet::parse(m).unwrap()),
            },
            upstream: 0,
            split: None,
            tenant: crate::config::model::TenantMode::Optional,
            access: None,
            cors: None,
            timeouts: Default::default(),
            request_headers: None,
            response_headers: None,
            strip_prefix: None,
            rewrite: None,
        }
    }

    #[test]
    fn first_match_wins_with_method_and_host() {
        let routes = vec![
            route(
                "products",
                Some("api.example.com"),
                "/v1/organizations/*/product/**",
                Some(&["GET", "PUT"]),
            ),
            route("default", None, "/**", None),
        ];
        let id = |m: Method, h: Option<&str>, p: &str| {
            find_route(&routes, &m, h, &Segments::new(p)).map(|(_, r)| r.id.clone())
        };
        assert_eq!(
            id(
                Method::GET,
                Some("api.example.com"),
                "/v1/organizations/a/product/1"
            )
            .as_deref(),
            Some("products")
        );
        assert_eq!(
            id(
                Method::POST,
                Some("api.example.com"),
                "/v1/organizations/a/product/1"
            )
            .as_deref(),
            Some("default")
        );
        assert_eq!(
            id(
                Method::GET,
                Some("other.com"),
                "/v1/organizations/a/product/1"
            )
            .as_deref(),
            Some("default")
        );
        assert_eq!(
            id(Method::GET, None, "/v1/organizations/a/product/1").as_deref(),
            Some("default")
        );
        let only = vec![route("p", None, "/p/*", None)];
        assert!(find_route(&only, &Method::GET, None, &Segments::new("/q")).is_none());
    }
}
