//! A `kind: List`'s items read in one pass each. The type an item is read
//! as comes from its apiVersion and kind, and reading those alone scans the
//! whole item (in key order a slice's endpoints come before its kind): for
//! a first listing of 50,000 slices that pass was about a third of the
//! parse. So an item is read as the type of the item before it, its
//! apiVersion and kind noted on the way; the result stands only when they
//! are that type's, each given once. Otherwise (another kind, a field
//! missing or given twice, any error) the caller reads it the two-pass way,
//! so every outcome and message is the two-pass one.

use std::{any::Any, borrow::Cow, cell::RefCell, fmt};

use k8s_openapi::{
    api::networking::v1::ServiceCIDR,
    api::{core::v1::Node, core::v1::Service},
};
use serde::de::{
    self, DeserializeOwned, DeserializeSeed, Deserializer, IntoDeserializer as _, MapAccess,
    Visitor, value::BorrowedStrDeserializer,
};

use crate::model::endpoint_slice::EndpointSlice;

/// `text` read as the type `(api_version, kind)` names, when it is one the
/// proxy reads and `text`'s top level names exactly that type.
pub fn read(text: &str, api_version: &str, kind: &str) -> Option<Box<dyn Any + Send>> {
    match (api_version, kind) {
        ("v1", "Service") => boxed(read_as::<Service>(text, api_version, kind)),
        ("discovery.k8s.io/v1", "EndpointSlice") => {
            boxed(read_as::<EndpointSlice>(text, api_version, kind))
        }
        ("v1", "Node") => boxed(read_as::<Node>(text, api_version, kind)),
        ("networking.k8s.io/v1", "ServiceCIDR") => {
            boxed(read_as::<ServiceCIDR>(text, api_version, kind))
        }
        _ => None,
    }
}

fn boxed<T: Any + Send>(object: Option<T>) -> Option<Box<dyn Any + Send>> {
    object.map(|o| Box::new(o) as Box<dyn Any + Send>)
}

/// What the top level said of itself.
#[derive(Default)]
struct Head {
    api_version: Option<String>,
    kind: Option<String>,
    /// A head field given twice, or an `items` field (which the two-pass
    /// head reads too, and may reject).
    doubtful: bool,
}

fn read_as<T: DeserializeOwned>(text: &str, api_version: &str, kind: &str) -> Option<T> {
    let head = RefCell::new(Head::default());
    let mut de = serde_json::Deserializer::from_str(text);
    let object = T::deserialize(Tap {
        inner: &mut de,
        head: &head,
    })
    .ok()?;
    de.end().ok()?;
    let head = head.into_inner();
    (!head.doubtful
        && head.api_version.as_deref() == Some(api_version)
        && head.kind.as_deref() == Some(kind))
    .then_some(object)
}

/// A deserializer that notes the head fields of the object it reads.
struct Tap<'h, D> {
    inner: D,
    head: &'h RefCell<Head>,
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for Tap<'_, D> {
    type Error = D::Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.inner.deserialize_any(TapVisitor {
            inner: visitor,
            head: self.head,
        })
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        let visitor = TapVisitor {
            inner: visitor,
            head: self.head,
        };
        self.inner.deserialize_struct(name, fields, visitor)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf option unit unit_struct newtype_struct seq tuple
        tuple_struct map enum identifier ignored_any
    }
}

/// The reader's visitor, its map's keys watched. Anything but a map is an
/// error, as for the types read here.
struct TapVisitor<'h, V> {
    inner: V,
    head: &'h RefCell<Head>,
}

impl<'de, V: Visitor<'de>> Visitor<'de> for TapVisitor<'_, V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        self.inner.expecting(f)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<V::Value, A::Error> {
        self.inner.visit_map(TapMap {
            inner: map,
            head: self.head,
            next: None,
        })
    }
}

#[derive(Clone, Copy)]
enum HeadField {
    ApiVersion,
    Kind,
}

struct TapMap<'h, A> {
    inner: A,
    head: &'h RefCell<Head>,
    /// The head field whose value comes next.
    next: Option<HeadField>,
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for TapMap<'_, A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        let Some(key) = self.inner.next_key_seed(KeyText)? else {
            return Ok(None);
        };
        self.next = match &*key {
            "apiVersion" => Some(HeadField::ApiVersion),
            "kind" => Some(HeadField::Kind),
            "items" => {
                self.head.borrow_mut().doubtful = true;
                None
            }
            _ => None,
        };
        match key {
            Cow::Borrowed(key) => seed.deserialize(BorrowedStrDeserializer::new(key)),
            Cow::Owned(key) => seed.deserialize(key.into_deserializer()),
        }
        .map(Some)
    }

    fn next_value_seed<S: DeserializeSeed<'de>>(&mut self, seed: S) -> Result<S::Value, A::Error> {
        let Some(field) = self.next.take() else {
            return self.inner.next_value_seed(seed);
        };
        let value: String = self.inner.next_value()?;
        let mut head = self.head.borrow_mut();
        let head = &mut *head;
        let slot = match field {
            HeadField::ApiVersion => &mut head.api_version,
            HeadField::Kind => &mut head.kind,
        };
        head.doubtful |= slot.is_some();
        *slot = Some(value.clone());
        seed.deserialize(value.into_deserializer())
    }
}

/// A map key's text, borrowed from the input where it has no escapes.
struct KeyText;

impl<'de> DeserializeSeed<'de> for KeyText {
    type Value = Cow<'de, str>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        struct Text;
        impl<'de> Visitor<'de> for Text {
            type Value = Cow<'de, str>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a key")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Cow::Borrowed(v))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Cow::Owned(v.to_owned()))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(Cow::Owned(v))
            }
        }
        d.deserialize_str(Text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SLICE: &str = r#"{"addressType":"IPv4","apiVersion":"discovery.k8s.io/v1","endpoints":[{"addresses":["198.18.1.11"]}],"kind":"EndpointSlice","metadata":{"name":"s","namespace":"n"}}"#;

    fn slice(text: &str) -> Option<EndpointSlice> {
        read(text, "discovery.k8s.io/v1", "EndpointSlice").map(|o| {
            *o.downcast::<EndpointSlice>()
                .expect("an EndpointSlice read as one")
        })
    }

    #[test]
    fn an_item_of_the_guessed_type_is_read_whole_in_one_pass() {
        let read = slice(SLICE).expect("read");
        assert_eq!(read, serde_json::from_str::<EndpointSlice>(SLICE).unwrap());
        let endpoints = read.endpoints.expect("endpoints read");
        assert_eq!(endpoints[0].addresses, vec!["198.18.1.11".to_owned()]);
    }

    #[test]
    fn anything_the_two_pass_way_would_judge_otherwise_is_left_to_it() {
        let without = |field: &str| {
            let mut v: serde_json::Value = serde_json::from_str(SLICE).unwrap();
            v.as_object_mut().unwrap().remove(field);
            v.to_string()
        };
        // Missing head fields: the two-pass way rejects the item.
        assert!(slice(&without("kind")).is_none());
        assert!(slice(&without("apiVersion")).is_none());
        // Another type's item.
        let service = r#"{"apiVersion":"v1","kind":"Service","metadata":{"name":"s"}}"#;
        assert!(slice(service).is_none());
        assert!(read(service, "v1", "Service").is_some());
        // A head field given twice, or an `items` field.
        let twice = SLICE.replace(
            r#""kind":"EndpointSlice","#,
            r#""kind":"EndpointSlice","kind":"EndpointSlice","#,
        );
        assert!(slice(&twice).is_none());
        let items = SLICE.replace(r#""kind":"#, r#""items":{},"kind":"#);
        assert!(slice(&items).is_none());
        // Trailing text, and not an object.
        assert!(slice(&format!("{SLICE} x")).is_none());
        assert!(slice("[]").is_none());
        // Types the proxy does not read are not read this way.
        assert!(read(r#"{"apiVersion":"v1","kind":"Pod"}"#, "v1", "Pod").is_none());
    }

    #[test]
    fn escaped_keys_are_read_too() {
        let escaped = SLICE.replace(r#""kind""#, r#""ki\u006ed""#);
        assert!(slice(&escaped).is_some());
    }
}
