use super::*;

#[test]
fn builtins_load() {
    for name in builtin_names() {
        let p = load(name).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(p.name(), name);
    }
}
