//! A user's password hash as a document carries it: an Argon2id PHC string (checked, with its
//! parameters bounded) or a legacy salted SHA-256 record.

use argon2::{ARGON2ID_IDENT, Params, PasswordHash};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use qq_core::meta::MetaCommand;
use qq_core::names::shown;

use super::error::DefinitionsError;
use super::{
    HASHING_ALGORITHM, LEGACY_HASHING_ALGORITHM, MAX_ARGON2_M_COST, MAX_ARGON2_P_COST,
    MAX_ARGON2_T_COST, invalid,
};

/// Checks an Argon2id PHC string before it is proposed: it must parse, name `argon2id`,
/// carry a salt and an output, and have parameters argon2 accepts, within the bounds above.
pub fn validate_phc(field: &str, phc: &str) -> Result<(), DefinitionsError> {
    let hash =
        PasswordHash::new(phc).map_err(|e| invalid(field, format!("not a PHC string: {e}")))?;
    if hash.algorithm != ARGON2ID_IDENT {
        return Err(invalid(
            field,
            format!(
                "algorithm '{}' is not argon2id",
                shown(hash.algorithm.as_str())
            ),
        ));
    }
    if hash.salt.is_none() || hash.hash.is_none() {
        return Err(invalid(field, "a PHC string needs a salt and a hash"));
    }
    let params =
        Params::try_from(&hash).map_err(|e| invalid(field, format!("bad parameters: {e}")))?;
    if params.m_cost() > MAX_ARGON2_M_COST
        || params.t_cost() > MAX_ARGON2_T_COST
        || params.p_cost() > MAX_ARGON2_P_COST
    {
        return Err(invalid(
            field,
            format!(
                "parameters m={}, t={}, p={} exceed m={MAX_ARGON2_M_COST}, \
                 t={MAX_ARGON2_T_COST}, p={MAX_ARGON2_P_COST}",
                params.m_cost(),
                params.t_cost(),
                params.p_cost()
            ),
        ));
    }
    Ok(())
}

/// Where a hash and its algorithm are in the request or document: what errors name.
#[derive(Debug, Clone, Copy)]
pub struct HashFields<'a> {
    pub hash: &'a str,
    pub algorithm: &'a str,
}

/// The `PutUser` command of a user with a given hash (`hashing_algorithm` as in the module
/// doc), validated.
pub fn put_user_with_hash(
    fields: HashFields<'_>,
    name: String,
    hash: &str,
    algorithm: &str,
    tags: Vec<String>,
) -> Result<MetaCommand, DefinitionsError> {
    let field = fields.hash;
    let (password_hash, salt) = match algorithm {
        HASHING_ALGORITHM => {
            validate_phc(field, hash)?;
            (hash.as_bytes().to_vec(), Vec::new())
        }
        LEGACY_HASHING_ALGORITHM => {
            let (salt, digest) = hash
                .split_once(':')
                .ok_or_else(|| invalid(field, "must be base64(salt):base64(sha256)"))?;
            let salt = B64
                .decode(salt)
                .map_err(|e| invalid(field, format!("salt is not base64: {e}")))?;
            let digest = B64
                .decode(digest)
                .map_err(|e| invalid(field, format!("hash is not base64: {e}")))?;
            if digest.len() != 32 || digest.starts_with(b"$argon2") {
                return Err(invalid(field, "a legacy hash is 32 bytes of SHA-256"));
            }
            (digest, salt)
        }
        other => {
            return Err(invalid(
                fields.algorithm,
                format!(
                    "'{}' cannot be verified by quorumq (only \
                     {HASHING_ALGORITHM} and {LEGACY_HASHING_ALGORITHM}); set the password \
                     with qqctl put-user instead",
                    shown(other)
                ),
            ));
        }
    };
    Ok(MetaCommand::PutUser {
        name,
        password_hash,
        salt,
        tags,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phc_validation() {
        use qq_core::meta::GUEST_PASSWORD_HASH;
        validate_phc("h", GUEST_PASSWORD_HASH).unwrap();
        let argon2i = GUEST_PASSWORD_HASH.replace("$argon2id$", "$argon2i$");
        assert!(
            validate_phc("h", &argon2i)
                .unwrap_err()
                .to_string()
                .contains("not argon2id")
        );
        let huge = GUEST_PASSWORD_HASH.replace("m=19456", "m=4000000");
        assert!(
            validate_phc("h", &huge)
                .unwrap_err()
                .to_string()
                .contains("exceed")
        );
    }
}
