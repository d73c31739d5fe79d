//! Who may call the operator routes, and what a user's token must carry.
//!
//! API Gateway authorizes first: the admin routes (`/admin/reels...`,
//! the reshard function) and erasure (`DELETE /admin/users/{user_id}/likes`,
//! the like function) with IAM (SigV4), the user routes with the JWT
//! authorizer. IAM authorization alone admits *any* principal of the
//! account that may `execute-api:Invoke`, and a JWT authorizer without a
//! scope admits ID tokens and any other app client's tokens. So the
//! functions check again, before any I/O (`http::parse_with`, which reads
//! the caller from the request in `http/access.rs`):
//!
//! * `ADMIN_PRINCIPALS`: the IAM principals that may use the admin routes
//!   (list resized reels, read a reel's shards, resize);
//! * `ERASURE_PRINCIPALS`: the IAM principals that may erase a user's likes.
//!   Separate on purpose: being allowed to resize does not allow erasure,
//!   nor the other way round.
//!
//! Both are comma-separated ARNs; **empty (or unset) refuses every
//! principal**. An entry matches the principal API Gateway authorized (the
//! request context's `authorizer.iam.userArn`) when:
//!
//! * it is that exact ARN (an IAM user `arn:aws:iam::ACCOUNT:user/NAME`, its
//!   path included, a federated user, or one role session
//!   `arn:aws:sts::ACCOUNT:assumed-role/ROLE/SESSION`); or
//! * it is a role, `arn:PARTITION:iam::ACCOUNT:role/[PATH/]ROLE`, and the
//!   principal is a session of it, `arn:PARTITION:sts::ACCOUNT:assumed-role/ROLE/SESSION`
//!   (any session name): same partition, same account, same role name. A
//!   session ARN carries no role path, and role names are unique in an
//!   account, so the name decides; the comparison is exact (case
//!   included).
//!
//! Nothing else matches: no wildcards, no prefixes, and no whole account —
//! `arn:aws:iam::ACCOUNT:root`, which in a resource policy means "the whole
//! account", is refused as an entry rather than read as the root user
//! alone. An entry that is not such an ARN stops the function at its cold
//! start (a typo must not silently refuse, or allow, someone).
//!
//! `JWT_SCOPE`: the scope a user route's token must carry (the template's
//! `JwtAuthorizationScope`, default `likes/api`), checked again here on the
//! claims API Gateway passes (`scope`, `scp`, and the authorizer's
//! `scopes`). Set and empty: no check. Unset: `likes/api` inside Lambda
//! (fail closed), no check elsewhere (the local stack and the tests, whose
//! tokens carry no scope).

/// The scope the template requires by default (`JwtAuthorizationScope`):
/// a Cognito resource server `likes` with a custom scope `api`.
pub const DEFAULT_JWT_SCOPE: &str = "likes/api";

/// An allowlist of IAM principals (see the module documentation).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Principals(Vec<String>);

impl Principals {
    /// The entries of a comma-separated list (`var` names it in errors):
    /// empty entries are skipped, every other one must be an ARN of an IAM
    /// user or role, a role session or a federated user.
    pub fn from_list(var: &str, list: &str) -> Result<Self, String> {
        let mut out = Vec::new();
        for entry in list.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            check_entry(entry).map_err(|why| format!("{var}: {entry:?}: {why}"))?;
            out.push(entry.to_owned());
        }
        Ok(Principals(out))
    }

    /// Whether no principal is allowed.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether the principal API Gateway authorized, by its ARN, is allowed.
    pub fn admits(&self, principal_arn: &str) -> bool {
        self.0
            .iter()
            .any(|e| e == principal_arn || session_of_role(principal_arn, e))
    }
}

/// `arn:PARTITION:SERVICE::ACCOUNT:RESOURCE` split, or `None`.
fn arn_parts(arn: &str) -> Option<[&str; 5]> {
    let mut p = arn.splitn(6, ':');
    let (arn_, partition, service, region, account, resource) = (
        p.next()?,
        p.next()?,
        p.next()?,
        p.next()?,
        p.next()?,
        p.next()?,
    );
    (arn_ == "arn" && !partition.is_empty() && region.is_empty())
        .then_some([partition, service, region, account, resource])
}

fn check_entry(entry: &str) -> Result<(), &'static str> {
    if entry
        .chars()
        .any(|c| c.is_whitespace() || c == '*' || c == '?')
    {
        return Err("no whitespace or wildcards: list exact ARNs");
    }
    let [_, service, _, account, resource] =
        arn_parts(entry).ok_or("not an ARN of the form arn:PARTITION:iam::ACCOUNT:...")?;
    if account.len() != 12 || !account.bytes().all(|b| b.is_ascii_digit()) {
        return Err("the account must be 12 digits");
    }
    let named = |prefix: &str, parts: usize| {
        resource.strip_prefix(prefix).is_some_and(|rest| {
            let segments: Vec<&str> = rest.split('/').collect();
            segments.iter().all(|s| !s.is_empty()) && (parts == 0 || segments.len() == parts)
        })
    };
    match service {
        "iam" if resource == "root" => Err(
            "the account's root user; it does not stand for the whole account here: list the \
             roles or users that may call",
        ),
        "iam" if named("user/", 0) || named("role/", 0) => Ok(()),
        "sts" if named("assumed-role/", 2) || named("federated-user/", 1) => Ok(()),
        _ => Err(
            "expected an IAM user or role (arn:aws:iam::ACCOUNT:user/NAME, \
             arn:aws:iam::ACCOUNT:role/NAME), a role session or a federated user",
        ),
    }
}

/// Whether `principal` is a session of the role `entry`:
/// `arn:P:sts::A:assumed-role/NAME/SESSION` of `arn:P:iam::A:role/[PATH/]NAME`.
fn session_of_role(principal: &str, entry: &str) -> bool {
    let (Some(p), Some(e)) = (arn_parts(principal), arn_parts(entry)) else {
        return false;
    };
    let [p_partition, "sts", _, p_account, p_resource] = p else {
        return false;
    };
    let [e_partition, "iam", _, e_account, e_resource] = e else {
        return false;
    };
    let Some(role_path) = e_resource.strip_prefix("role/") else {
        return false;
    };
    let role = role_path.rsplit('/').next().unwrap_or("");
    let Some(session) = p_resource.strip_prefix("assumed-role/") else {
        return false;
    };
    let mut s = session.split('/');
    let (Some(name), Some(session_name), None) = (s.next(), s.next(), s.next()) else {
        return false;
    };
    !role.is_empty()
        && !session_name.is_empty()
        && name == role
        && p_partition == e_partition
        && p_account == e_account
}

/// The function's own checks of who may call (see the module
/// documentation); part of [`crate::Config`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Access {
    /// `ADMIN_PRINCIPALS` (default empty: nobody): who may use the admin
    /// routes.
    pub admin: Principals,
    /// `ERASURE_PRINCIPALS` (default empty: nobody): who may erase a
    /// user's likes.
    pub erasure: Principals,
    /// `JWT_SCOPE`: the scope a user route's token must carry; `None`, no
    /// check.
    pub jwt_scope: Option<String>,
    /// `CALLER_READ_UNITS_PER_MIN` (default 6000, 0: no bound): the read
    /// units one caller's count reads may cost per UTC minute, across
    /// instances (`crate::service`'s read budget).
    pub read_units_per_min: u32,
}

impl Access {
    /// Reads `ADMIN_PRINCIPALS`, `ERASURE_PRINCIPALS` and `JWT_SCOPE`
    /// through `get`; `in_lambda` makes an unset `JWT_SCOPE` the default
    /// scope instead of no check.
    pub fn from_lookup(
        get: impl Fn(&str) -> Option<String>,
        in_lambda: bool,
    ) -> Result<Self, String> {
        let admin = Principals::from_list(
            "ADMIN_PRINCIPALS",
            &get("ADMIN_PRINCIPALS").unwrap_or_default(),
        )?;
        let erasure = Principals::from_list(
            "ERASURE_PRINCIPALS",
            &get("ERASURE_PRINCIPALS").unwrap_or_default(),
        )?;
        let jwt_scope = match get("JWT_SCOPE") {
            None if in_lambda => Some(DEFAULT_JWT_SCOPE.to_owned()),
            None => None,
            Some(s) if s.trim().is_empty() => None,
            Some(s) if s.trim().chars().any(char::is_whitespace) => {
                return Err(format!("JWT_SCOPE={s:?}: one scope, without whitespace"));
            }
            Some(s) => Some(s.trim().to_owned()),
        };
        let read_units_per_min = match get("CALLER_READ_UNITS_PER_MIN") {
            None => 6_000,
            Some(v) if v.trim().is_empty() => 6_000,
            Some(v) => v
                .trim()
                .parse::<u32>()
                .ok()
                .filter(|n| *n <= 100_000_000)
                .ok_or_else(|| {
                    format!("CALLER_READ_UNITS_PER_MIN={v:?}: a whole number, 0 to 100000000")
                })?,
        };
        Ok(Access {
            admin,
            erasure,
            jwt_scope,
            read_units_per_min,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_exact_arns_of_principals() {
        let ok = Principals::from_list(
            "ADMIN_PRINCIPALS",
            " arn:aws:iam::123456789012:role/ops/likes-operators ,, \
             arn:aws:iam::123456789012:user/alice,\
             arn:aws:sts::123456789012:assumed-role/break-glass/bob,\
             arn:aws-us-gov:sts::123456789012:federated-user/carol",
        )
        .unwrap();
        assert_eq!(ok.0.len(), 4);
        assert!(Principals::from_list("X", "").unwrap().is_empty());
        assert!(Principals::from_list("X", " , ").unwrap().is_empty());
        for bad in [
            "arn:aws:iam::123456789012:root",
            "arn:aws:iam::123456789012:role/*",
            "arn:aws:iam::123456789012:role/a?",
            "arn:aws:iam::*:role/ops",
            "arn:aws:iam::12345:role/ops",
            "arn:aws:iam::123456789012:group/admins",
            "arn:aws:iam::123456789012:role/",
            "arn:aws:iam:us-east-1:123456789012:role/ops",
            "arn:aws:sts::123456789012:assumed-role/ops",
            "arn:aws:s3:::bucket",
            "123456789012",
            "ops",
        ] {
            let e = Principals::from_list("ADMIN_PRINCIPALS", bad).unwrap_err();
            assert!(e.starts_with("ADMIN_PRINCIPALS: "), "{e}");
        }
    }

    #[test]
    fn a_role_allows_its_sessions_and_nothing_else() {
        let p = Principals::from_list(
            "ADMIN_PRINCIPALS",
            "arn:aws:iam::123456789012:role/ops/likes-operators,arn:aws:iam::123456789012:user/alice",
        )
        .unwrap();
        for yes in [
            "arn:aws:iam::123456789012:role/ops/likes-operators",
            "arn:aws:sts::123456789012:assumed-role/likes-operators/ops-admin",
            "arn:aws:sts::123456789012:assumed-role/likes-operators/x@example.com",
            "arn:aws:iam::123456789012:user/alice",
        ] {
            assert!(p.admits(yes), "{yes}");
        }
        for no in [
            // Another account, partition or role; a role named alike.
            "arn:aws:sts::210987654321:assumed-role/likes-operators/ops-admin",
            "arn:aws-cn:sts::123456789012:assumed-role/likes-operators/ops-admin",
            "arn:aws:sts::123456789012:assumed-role/likes-operators-2/ops-admin",
            "arn:aws:sts::123456789012:assumed-role/Likes-Operators/ops-admin",
            "arn:aws:sts::123456789012:assumed-role/likes-operators/",
            "arn:aws:sts::123456789012:assumed-role/likes-operators",
            "arn:aws:sts::123456789012:assumed-role/likes-operators/a/b",
            "arn:aws:sts::123456789012:assumed-role/ops/likes-operators",
            // A user is not its sessions' role, nor a prefix a user.
            "arn:aws:sts::123456789012:assumed-role/alice/s",
            "arn:aws:iam::123456789012:user/alice2",
            "arn:aws:iam::123456789012:user/x/alice",
            "arn:aws:iam::123456789012:role/likes-operators",
            "",
        ] {
            assert!(!p.admits(no), "{no}");
        }
        // A session listed exactly allows that session only.
        let one = Principals::from_list(
            "ERASURE_PRINCIPALS",
            "arn:aws:sts::123456789012:assumed-role/privacy/dpo",
        )
        .unwrap();
        assert!(one.admits("arn:aws:sts::123456789012:assumed-role/privacy/dpo"));
        assert!(!one.admits("arn:aws:sts::123456789012:assumed-role/privacy/other"));
        assert!(!Principals::default().admits("arn:aws:iam::123456789012:user/alice"));
    }

    #[test]
    fn the_scope_defaults_inside_lambda_and_empty_turns_it_off() {
        let from = |vars: &[(&str, &str)], in_lambda| {
            Access::from_lookup(
                |k| {
                    vars.iter()
                        .find(|(n, _)| *n == k)
                        .map(|(_, v)| (*v).to_owned())
                },
                in_lambda,
            )
        };
        let a = from(&[], true).unwrap();
        assert_eq!(a.jwt_scope.as_deref(), Some(DEFAULT_JWT_SCOPE));
        assert!(a.admin.is_empty() && a.erasure.is_empty());
        assert_eq!(from(&[], false).unwrap().jwt_scope, None);
        assert_eq!(from(&[("JWT_SCOPE", "")], true).unwrap().jwt_scope, None);
        assert_eq!(
            from(&[("JWT_SCOPE", " likes/read ")], false)
                .unwrap()
                .jwt_scope
                .as_deref(),
            Some("likes/read")
        );
        assert!(from(&[("JWT_SCOPE", "a b")], true).is_err());
        assert!(from(&[("ADMIN_PRINCIPALS", "*")], true).is_err());
        assert!(
            from(
                &[("ERASURE_PRINCIPALS", "arn:aws:iam::123456789012:root")],
                true
            )
            .is_err()
        );
    }
}
