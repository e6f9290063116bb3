//! [`Credentials`]: who a client's calls say they come from, as the call
//! metadata every gRPC request carries.

use tonic::metadata::{Ascii, MetadataValue};

use crate::error::Error;
use crate::options::ClientOptions;

/// Who a client's calls say they come from, as call metadata: a user and
/// its password ([`ClientOptions::with_user`]), or else the cluster
/// secret when the client has one (a replica treats a client call carrying
/// its cluster secret as its own application's: root, while access control
/// is on).
#[derive(Clone)]
pub(crate) struct Credentials {
    user: Option<(MetadataValue<Ascii>, MetadataValue<Ascii>)>,
    secret: Option<MetadataValue<Ascii>>,
}

impl Credentials {
    /// The metadata for `options`, `None` if they name nobody, or why it
    /// cannot be sent.
    pub(crate) fn new(options: &ClientOptions) -> Result<Option<Credentials>, Error> {
        let value = |what: &str, text: &str| {
            MetadataValue::try_from(text).map_err(|_| {
                Error::InvalidArgument(format!(
                    "the {what} must be visible ASCII characters to travel as call metadata"
                ))
            })
        };
        let user = match &options.user {
            Some(u) => Some((
                value("user name", &u.name)?,
                value("password", u.password())?,
            )),
            None => None,
        };
        // A named user is who the calls are made as: the cluster secret
        // (which would make them root's) goes only on calls naming nobody.
        let secret = match (&user, &options.cluster_secret) {
            (None, Some(s)) => Some(value("cluster secret", s)?),
            _ => None,
        };
        Ok((user.is_some() || secret.is_some()).then_some(Credentials { user, secret }))
    }
}

/// `message` as a request with `credentials`, if any.
pub(crate) fn as_user<T>(credentials: &Option<Credentials>, message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Some(c) = credentials {
        let metadata = request.metadata_mut();
        if let Some((user, password)) = &c.user {
            metadata.insert(latchkey_proto::USER_HEADER, user.clone());
            metadata.insert(latchkey_proto::PASSWORD_HEADER, password.clone());
        }
        if let Some(secret) = &c.secret {
            metadata.insert(latchkey_proto::CLUSTER_SECRET_HEADER, secret.clone());
        }
    }
    request
}
