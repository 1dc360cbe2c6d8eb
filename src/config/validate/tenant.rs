//! `tenant` sources and `plans`.

use super::*;

pub(super) fn check_tenant(
    c: &mut Checker,
    t: &TenantFile,
    includes: &mut Vec<PathBuf>,
) -> TenantSettings {
    let mut sources = Vec::new();
    for (i, s) in t.from.iter().enumerate() {
        let base = format!("tenant.from[{i}]");
        match s {
            TenantSourceFile::ApiKey(k) => {
                let header = header_name(c, &format!("{base}.api_key.header"), &k.header);
                let keys = match (&k.keys, &k.keys_file) {
                    (Some(map), None) => Some(map.clone()),
                    (None, Some(f)) => {
                        let target = resolve_relative(&c.file, f);
                        includes.push(target.clone());
                        read_include::<BTreeMap<String, String>>(
                            c,
                            &format!("{base}.api_key.keys_file"),
                            "keys_file",
                            &target,
                        )
                        .map(|(m, _)| m)
                    }
                    _ => {
                        c.err(
                            &format!("{base}.api_key"),
                            "give exactly one of `keys` (a map of key to tenant) or `keys_file` (a YAML file holding that map)",
                        );
                        None
                    }
                };
                if let (Some(header), Some(keys)) = (header, keys) {
                    if let Some((_, _)) = keys.iter().find(|(k, v)| k.is_empty() || v.is_empty()) {
                        c.err(
                            &format!("{base}.api_key"),
                            "keys and tenants must not be empty",
                        );
                    }
                    sources.push(TenantSource::ApiKey {
                        header,
                        keys: keys.into_iter().collect(),
                    });
                }
            }
            TenantSourceFile::Path(p) => {
                let pat = check_pattern(c, &format!("{base}.path"), p);
                if !pat.has_capture() && PathPattern::compile(p).is_ok() {
                    c.err(
                        &format!("{base}.path"),
                        format!("path {p:?} must capture the tenant with one `{{tenant}}` segment"),
                    );
                }
                sources.push(TenantSource::Path(pat));
            }
            TenantSourceFile::Header(h) => {
                if let Some(h) = header_name(c, &format!("{base}.header"), h) {
                    sources.push(TenantSource::Header(h));
                }
            }
            TenantSourceFile::ClientIp(_) => sources.push(TenantSource::ClientIp),
        }
    }
    let (forward_header, strip_header) = match &t.forward_header {
        None => (Some(default_tenant_header()), default_tenant_header()),
        Some(ForwardHeaderFile::Off) => (None, default_tenant_header()),
        Some(ForwardHeaderFile::Name(h)) => {
            let name =
                header_name(c, "tenant.forward_header", h).unwrap_or_else(default_tenant_header);
            (Some(name.clone()), name)
        }
    };
    TenantSettings {
        sources,
        required: t.required,
        forward_name: forward_header.as_ref().map_or_else(bytes::Bytes::new, |h| {
            bytes::Bytes::copy_from_slice(h.as_str().as_bytes())
        }),
        forward_header,
        strip_header,
    }
}

pub(super) fn check_plans(c: &mut Checker, plans: &BTreeMap<String, Vec<String>>) -> Plans {
    let mut out = Plans::default();
    for (name, tenants) in plans {
        let base = format!("plans.{name}");
        if !valid_id(name) {
            c.err_key(&base, format!("invalid plan name {name:?}: {ID_RULE}"));
        }
        let idx = out.names.len();
        out.names.push(name.clone());
        for (i, t) in tenants.iter().enumerate() {
            if t.is_empty() {
                c.err(&format!("{base}[{i}]"), "tenant id must not be empty");
                continue;
            }
            let key: Box<[u8]> = t.as_bytes().into();
            if let Some(prev) = out.by_tenant.insert(key, idx) {
                c.err(
                    &format!("{base}[{i}]"),
                    format!(
                        "tenant {t:?} is already in plan {:?}: a tenant belongs to one plan",
                        out.names[prev]
                    ),
                );
            }
        }
    }
    out
}
