//! Text from traced processes in HTML and SVG.
//!
//! Names of processes and /dev/shm objects are chosen by whoever runs in the container: a name
//! like `<img src=x onerror=...>` must stay text. Control characters were already made visible
//! when the event was decoded (`crate::event::escape`); here the five characters that mean
//! something in markup become entities, which is safe both in element content and in
//! double-quoted attribute values (the only places the page puts such text).
use std::fmt;

/// Displays `text` with `&`, `<`, `>`, `"` and `'` as character references.
pub struct Html<'a>(pub &'a str);

impl fmt::Display for Html<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut rest = self.0;
        while let Some(i) = rest.find(['&', '<', '>', '"', '\'']) {
            f.write_str(&rest[..i])?;
            f.write_str(match rest.as_bytes()[i] {
                b'&' => "&amp;",
                b'<' => "&lt;",
                b'>' => "&gt;",
                b'"' => "&quot;",
                _ => "&#39;",
            })?;
            rest = &rest[i + 1..];
        }
        f.write_str(rest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup() {
        assert_eq!(
            Html(r#"<img src=x onerror="alert('1')">&amp;"#).to_string(),
            "&lt;img src=x onerror=&quot;alert(&#39;1&#39;)&quot;&gt;&amp;amp;"
        );
        assert_eq!(Html("torch_1_2_0").to_string(), "torch_1_2_0");
        assert_eq!(Html("café · ünï").to_string(), "café · ünï");
        assert_eq!(Html("").to_string(), "");
    }
}
