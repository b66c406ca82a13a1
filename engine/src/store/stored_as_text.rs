//! [`stored_as_text!`](crate::stored_as_text): an enum of unit variants, stored as its text in a text column.

/// Stores enums of unit variants as their text: for each `Type { Variant = "text", … }` given, writes
///
/// - `Type::as_str`, the variant's text (a `const fn`, no allocation);
/// - `FromStr`: the variant a text names; any other text is an error that lists the texts;
/// - `Display`: the text (padded when a width is asked for, as `{:<10}`);
/// - sqlx's `Type`, `Encode` and `Decode` over every database whose `str` they are implemented for (Postgres,
///   SQLite, MySQL / MariaDB): the column is a text column holding exactly that text, so a type can replace
///   string constants with no migration and no change to any stored value. A value this version does not know
///   is a decode error, never a silent default.
///
/// Statuses of the engine ([`WorkflowState`](crate::store::WorkflowState) and the others) and of the crates
/// above it use it, so that each stored status is written and read by the same code. Keep the texts and any
/// `#[serde(rename_all = "snake_case")]` of the type in agreement, as its tests check. The expansion names
/// `::sqlx`: the calling crate depends on sqlx (the one it binds with).
///
/// ```
/// use onceflow_engine::stored_as_text;
///
/// #[derive(Debug, Clone, Copy, PartialEq, Eq)]
/// pub enum Light {
///     Red,
///     Green,
/// }
///
/// stored_as_text! {
///     Light { Red = "red", Green = "green" }
/// }
///
/// assert_eq!(Light::Green.as_str(), "green");
/// assert_eq!("red".parse::<Light>(), Ok(Light::Red));
/// assert!("blue".parse::<Light>().is_err());
/// assert_eq!(format!("[{:<6}]", Light::Red), "[red   ]");
/// ```
#[macro_export]
macro_rules! stored_as_text {
    ($($ty:ident { $($variant:ident = $text:literal),+ $(,)? })+) => {$(
        impl $ty {
            /// Its text, as stored and shown.
            pub const fn as_str(self) -> &'static str {
                match self { $(Self::$variant => $text),+ }
            }
        }

        impl ::core::str::FromStr for $ty {
            type Err = ::std::string::String;
            fn from_str(s: &str) -> ::core::result::Result<Self, ::std::string::String> {
                match s {
                    $($text => ::core::result::Result::Ok(Self::$variant),)+
                    other => ::core::result::Result::Err(::std::format!(
                        "`{other}` is not a {}: one of {}",
                        stringify!($ty),
                        [$($text),+].join(", "),
                    )),
                }
            }
        }

        impl ::core::fmt::Display for $ty {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                f.pad(self.as_str())
            }
        }

        impl<DB: ::sqlx::Database> ::sqlx::Type<DB> for $ty
        where
            str: ::sqlx::Type<DB>,
        {
            fn type_info() -> DB::TypeInfo {
                <str as ::sqlx::Type<DB>>::type_info()
            }
            fn compatible(ty: &DB::TypeInfo) -> bool {
                <str as ::sqlx::Type<DB>>::compatible(ty)
            }
        }

        impl<'q, DB: ::sqlx::Database> ::sqlx::Encode<'q, DB> for $ty
        where
            &'static str: ::sqlx::Encode<'q, DB>,
        {
            fn encode_by_ref(
                &self,
                buf: &mut DB::ArgumentBuffer,
            ) -> ::core::result::Result<::sqlx::encode::IsNull, ::sqlx::error::BoxDynError> {
                ::sqlx::Encode::<'q, DB>::encode_by_ref(&self.as_str(), buf)
            }
            // As its text would be bound: the same type information and buffer reservation.
            fn produces(&self) -> ::core::option::Option<DB::TypeInfo> {
                ::sqlx::Encode::<'q, DB>::produces(&self.as_str())
            }
            fn size_hint(&self) -> usize {
                ::sqlx::Encode::<'q, DB>::size_hint(&self.as_str())
            }
        }

        impl<'r, DB: ::sqlx::Database> ::sqlx::Decode<'r, DB> for $ty
        where
            &'r str: ::sqlx::Decode<'r, DB>,
        {
            fn decode(value: DB::ValueRef<'r>) -> ::core::result::Result<Self, ::sqlx::error::BoxDynError> {
                ::core::result::Result::Ok(<&'r str as ::sqlx::Decode<'r, DB>>::decode(value)?.parse()?)
            }
        }
    )+};
}
