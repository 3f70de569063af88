//! The XML of S3 and STS answers, read through instant-xml (already in the
//! tree for rusty-s3) as a tree of elements, looked up by local name: the
//! stores disagree on namespaces (AWS puts its own on most answers and none
//! on errors; emulators vary), and a name is what identifies an element.
//! Bodies are read with a size limit before they get here, and the parser
//! bounds nesting.

use instant_xml::AnyElement;

/// A parsed document.
pub(crate) struct Doc<'a>(AnyElement<'a>);

impl<'a> Doc<'a> {
    /// Parses `text`: a well-formed document, or why not.
    pub(crate) fn parse(text: &'a str) -> Result<Doc<'a>, String> {
        instant_xml::from_str::<AnyElement<'a>>(text)
            .map(Doc)
            .map_err(|e| format!("not well-formed XML ({e})"))
    }

    /// The root element's local name.
    pub(crate) fn root(&self) -> &str {
        &self.0.name
    }

    /// The text of the element at `path` (local names, below the root),
    /// the first of each name on the way.
    pub(crate) fn text(&self, path: &[&str]) -> Option<&str> {
        let mut el = &self.0;
        for name in path {
            el = el.children.iter().find(|c| c.name == *name)?;
        }
        el.text.as_deref().map(str::trim)
    }
}

/// The error code of an S3 or STS error document (`<Error><Code>` or
/// `<ErrorResponse><Error><Code>`), if it has a plausible one (the message
/// is left out: some quote the request, and nothing of a request is shown).
pub(crate) fn error_code(body: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(body).ok()?;
    let doc = Doc::parse(text).ok()?;
    let code = match doc.root() {
        "Error" => doc.text(&["Code"]),
        "ErrorResponse" => doc.text(&["Error", "Code"]),
        _ => None,
    }?;
    (!code.is_empty()
        && code.len() <= 64
        && code.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.'))
    .then(|| code.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_codes_are_read_from_s3_and_sts_documents() {
        let cases: &[(&str, Option<&str>)] = &[
            (
                "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>NoSuchKey</Code><Message>The key &lt;k&gt;</Message></Error>",
                Some("NoSuchKey"),
            ),
            (
                "<ErrorResponse xmlns=\"https://sts.amazonaws.com/doc/2011-06-15/\"><Error><Type>Sender</Type><Code>InvalidIdentityToken</Code></Error></ErrorResponse>",
                Some("InvalidIdentityToken"),
            ),
            ("<Error><Code>a b</Code></Error>", None),
            ("<Error><Code></Code></Error>", None),
            ("<Other><Code>X</Code></Other>", None),
            // A body cut short after its code still names it.
            ("<Error><Code>X</Code>", Some("X")),
            ("not xml", None),
            ("", None),
        ];
        for (body, want) in cases {
            assert_eq!(error_code(body.as_bytes()).as_deref(), *want, "{body}");
        }
    }

    #[test]
    fn elements_are_found_by_local_name_whatever_the_namespace() {
        for xml in [
            "<CopyPartResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><LastModified>x</LastModified><ETag>&quot;ab&quot;</ETag></CopyPartResult>",
            "<CopyPartResult><ETag>&quot;ab&quot;</ETag></CopyPartResult>",
            "<s3:CopyPartResult xmlns:s3=\"http://s3.amazonaws.com/doc/2006-03-01/\"><s3:ETag>&quot;ab&quot;</s3:ETag></s3:CopyPartResult>",
        ] {
            let doc = Doc::parse(xml).unwrap();
            assert_eq!(doc.root(), "CopyPartResult", "{xml}");
            assert_eq!(doc.text(&["ETag"]), Some("\"ab\""), "{xml}");
            assert_eq!(doc.text(&["Code"]), None);
        }
        // Nesting is bounded by the parser.
        let deep = "<a>".repeat(10_000) + &"</a>".repeat(10_000);
        assert!(Doc::parse(&deep).is_err());
    }
}
