//! `ExportDefinitions` and `ImportDefinitions` (administrators only): the adapters over
//! [`crate::definitions`], which owns the document, its checks and the import.

use qq_proto::v1 as pb;
use tonic::{Request, Response, Status};

use super::Api;
use crate::definitions::{Document, MAX_DEFINITIONS_BYTES, export as export_state, import as run};

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
        return Err(Status::resource_exhausted(format!(
            "definitions_json: {} bytes, more than the bound of {MAX_DEFINITIONS_BYTES}",
            text.len()
        )));
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
