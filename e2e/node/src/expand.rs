//! Kubernetes' `$(VAR)` expansion, as the kubelet applies it to env values, `command` and
//! `args`: a reference to a defined variable is replaced, `$$` is a literal `$`, and anything
//! else (an undefined variable, a lone `$`, an unclosed `$(`) stays as written.

/// Expands `input` with `lookup`.
pub fn expand(input: &str, lookup: impl Fn(&str) -> Option<String>) -> String {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(inner) = after.strip_prefix('(')
            && let Some(close) = inner.find(')')
        {
            let name = &inner[..close];
            match lookup(name) {
                Some(value) => out.push_str(&value),
                None => {
                    out.push_str("$(");
                    out.push_str(name);
                    out.push(')');
                }
            }
            rest = &inner[close + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::expand;

    fn vars(name: &str) -> Option<String> {
        match name {
            "POD" => Some("shardwise-2".into()),
            "EMPTY" => Some(String::new()),
            _ => None,
        }
    }

    #[test]
    fn defined_variables_are_replaced_and_the_rest_stays_as_written() {
        assert_eq!(expand("--pod=$(POD)", vars), "--pod=shardwise-2");
        assert_eq!(expand("$(POD)$(POD)", vars), "shardwise-2shardwise-2");
        assert_eq!(expand("x$(EMPTY)y", vars), "xy");
        assert_eq!(expand("$(MISSING)", vars), "$(MISSING)");
        assert_eq!(expand("$$(POD)", vars), "$(POD)");
        assert_eq!(expand("cost: 5$", vars), "cost: 5$");
        assert_eq!(expand("$(POD", vars), "$(POD");
        assert_eq!(expand("a$b", vars), "a$b");
        assert_eq!(expand("", vars), "");
    }
}
