//! `ExportDefinitions` and `ImportDefinitions` (administrators only): the adapters over
//! [`crate::definitions`], which owns the document, its checks and the import.

use qq_proto::v1 as pb;
use tonic::{Request, Response, Status};

use super::Api;
use super::convert::kind_code;
use crate::definitions::{
    Cause, DefinitionsError, Document, MAX_DEFINITIONS_BYTES, export as export_state, import as run,
};
use qq_core::meta::ErrorKind;

/// The one mapping of an import's failure to a gRPC status: the document's faults are
/// INVALID_ARGUMENT (RESOURCE_EXHAUSTED past the size bound), the metadata's refusals keep
/// their kind, a proposal that did not get through keeps the node's status (UNAVAILABLE: retry).
impl From<DefinitionsError> for Status {
    fn from(e: DefinitionsError) -> Status {
        let code = match &e {
            DefinitionsError::Invalid { .. } => tonic::Code::InvalidArgument,
            DefinitionsError::TooLarge { .. } => tonic::Code::ResourceExhausted,
            DefinitionsError::Refused { kind, .. } => item_code(*kind),
            DefinitionsError::Stopped { cause, .. } => match cause {
                Cause::Refused(refusal) => item_code(refusal.kind),
                Cause::Node(node) => Status::from(node.clone()).code(),
            },
        };
        Status::new(code, e.to_string())
    }
}

/// The status code of a metadata refusal of a document's item: what is missing is the
/// document's own fault (INVALID_ARGUMENT), any other kind as for a single request.
fn item_code(kind: ErrorKind) -> tonic::Code {
    match kind {
        ErrorKind::NotFound => tonic::Code::InvalidArgument,
        kind => kind_code(kind),
    }
}

pub async fn export(
    api: &Api,
    request: Request<pb::ExportDefinitionsRequest>,
) -> Result<Response<pb::ExportDefinitionsResponse>, Status> {
    api.admin(&request).await?;
    let state = api.node.view().current();
    let document = export_state(&state);
    let definitions_json = serde_json::to_string_pretty(&document)
        .map_err(|e| Status::internal(format!("definitions: encode: {e}")))?;
    Ok(Response::new(pb::ExportDefinitionsResponse {
        definitions_json,
    }))
}

pub async fn import(
    api: &Api,
    request: Request<pb::ImportDefinitionsRequest>,
) -> Result<Response<pb::ImportDefinitionsResponse>, Status> {
    let caller = api.admin(&request).await?;
    let text = request.into_inner().definitions_json;
    if text.len() > MAX_DEFINITIONS_BYTES {
        return Err(DefinitionsError::TooLarge { bytes: text.len() }.into());
    }
    let doc = Document::parse(text.as_bytes())?;
    let state = api.node.view().current();
    let nodes = api.node.placement_nodes();
    let summary = run(
        api.node.proposer(),
        &state,
        &doc,
        &nodes,
        Some(&caller.user),
    )
    .await?;
    Ok(Response::new(pb::ImportDefinitionsResponse {
        counts: summary
            .counts
            .into_iter()
            .map(|(kind, created, updated, unchanged)| pb::ImportCount {
                kind,
                created,
                updated,
                unchanged,
            })
            .collect(),
    }))
}
