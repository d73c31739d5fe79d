//! The tables `template.yaml` defines, made on the local endpoint: created
//! when missing, brought up to date when kept from an older template (a
//! `DYNOXIDE_DB_FILE`), and waited for until ACTIVE: everything the stack
//! needs of the tables before anything runs on them.

use super::StackOptions;
use super::sdk::sdk_error;
use crate::template::{TableDef, Template};
use anyhow::{Result, anyhow};
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, CreateGlobalSecondaryIndexAction, GlobalSecondaryIndex,
    GlobalSecondaryIndexUpdate, IndexStatus, KeySchemaElement, KeyType, Projection, ProjectionType,
    ScalarAttributeType, StreamSpecification, StreamViewType, TableStatus, TimeToLiveSpecification,
    TimeToLiveStatus,
};
use std::collections::HashSet;
use std::time::Duration;

/// The name of the table `logical_id`: the variable the template wires to
/// it, else the logical id itself.
pub(super) fn table_name(template: &Template, opts: &StackOptions, logical_id: &str) -> String {
    template
        .table_env
        .iter()
        .find(|(_, id)| *id == logical_id)
        .and_then(|(var, _)| opts.lookup(var))
        .unwrap_or_else(|| logical_id.to_owned())
}

/// The names of the tables on the endpoint, every page of `ListTables`:
/// how the stack finds the ones to create without asking for a table that
/// is not there (a `DescribeTable` of a missing table is an error answer,
/// which dynoxide logs as a warning, one per table on every first start).
/// `None` when the endpoint does not list them (an IAM policy without
/// `dynamodb:ListTables`, on AWS): [`ensure_table`] then asks for each.
pub(super) async fn existing_tables(client: &Client) -> Option<HashSet<String>> {
    let mut names = HashSet::new();
    let mut start: Option<String> = None;
    loop {
        let page = match client
            .list_tables()
            .set_exclusive_start_table_name(start.clone())
            .send()
            .await
        {
            Ok(page) => page,
            Err(e) => {
                tracing::debug!(
                    error = %sdk_error("listing tables".into(), &e),
                    "asking for each table instead"
                );
                return None;
            }
        };
        names.extend(page.table_names().iter().cloned());
        match page.last_evaluated_table_name() {
            // A page that ends where it started would repeat forever.
            Some(last) if start.as_deref() != Some(last) => start = Some(last.to_owned()),
            _ => return Some(names),
        }
    }
}

/// Creates `name` from the template's definition unless it exists, and
/// waits until it is ACTIVE. `existing`: the tables on the endpoint
/// ([`existing_tables`]); `None`: ask for `name` itself.
pub(super) async fn ensure_table(
    client: &Client,
    name: &str,
    def: &TableDef,
    existing: Option<&HashSet<String>>,
) -> Result<()> {
    let exists = match existing {
        Some(names) => names.contains(name),
        None => client
            .describe_table()
            .table_name(name)
            .send()
            .await
            .is_ok(),
    };
    if !exists {
        let mut req = client
            .create_table()
            .table_name(name)
            .billing_mode(BillingMode::PayPerRequest);
        req = req
            .set_key_schema(Some(key_schema(&def.key_schema)?))
            .set_attribute_definitions(Some(attribute_definitions(def)?));
        if let Some(view) = &def.stream_view_type {
            req = req.stream_specification(
                StreamSpecification::builder()
                    .stream_enabled(true)
                    .stream_view_type(StreamViewType::from(view.as_str()))
                    .build()?,
            );
        }
        for index in &def.indexes {
            req = req.global_secondary_indexes(
                GlobalSecondaryIndex::builder()
                    .index_name(&index.name)
                    .set_key_schema(Some(key_schema(&index.key_schema)?))
                    .projection(projection(&index.projection))
                    .build()?,
            );
        }
        match req.send().await {
            Ok(_) => tracing::info!(table = name, "created table"),
            Err(e)
                if e.as_service_error()
                    .is_some_and(|s| s.is_resource_in_use_exception()) => {}
            Err(e) => {
                return Err(sdk_error(format!("creating table {name}"), &e));
            }
        }
    }
    for _ in 0..120 {
        let out = client
            .describe_table()
            .table_name(name)
            .send()
            .await
            .map_err(|e| sdk_error(format!("describing {name}"), &e))?;
        let table = out.table();
        let indexes_active = table
            .map(|t| t.global_secondary_indexes())
            .unwrap_or_default()
            .iter()
            .all(|i| i.index_status().is_none_or(|s| *s == IndexStatus::Active));
        if table.and_then(|t| t.table_status()) == Some(&TableStatus::Active) && indexes_active {
            // A table kept from an older template (a DYNOXIDE_DB_FILE) gets
            // the indexes it lacks.
            let have: Vec<&str> = table
                .map(|t| t.global_secondary_indexes())
                .unwrap_or_default()
                .iter()
                .filter_map(|i| i.index_name())
                .collect();
            if let Some(index) = def
                .indexes
                .iter()
                .find(|i| !have.contains(&i.name.as_str()))
            {
                client
                    .update_table()
                    .table_name(name)
                    .set_attribute_definitions(Some(attribute_definitions(def)?))
                    .global_secondary_index_updates(
                        GlobalSecondaryIndexUpdate::builder()
                            .create(
                                CreateGlobalSecondaryIndexAction::builder()
                                    .index_name(&index.name)
                                    .set_key_schema(Some(key_schema(&index.key_schema)?))
                                    .projection(projection(&index.projection))
                                    .build()?,
                            )
                            .build(),
                    )
                    .send()
                    .await
                    .map_err(|e| sdk_error(format!("adding index {} to {name}", index.name), &e))?;
                tracing::info!(table = name, index = %index.name, "added index");
                continue;
            }
            // A table kept from an older template gets the stream it lacks.
            if let Some(view) = &def.stream_view_type
                && table
                    .and_then(|t| t.stream_specification())
                    .is_none_or(|s| !s.stream_enabled())
            {
                client
                    .update_table()
                    .table_name(name)
                    .stream_specification(
                        StreamSpecification::builder()
                            .stream_enabled(true)
                            .stream_view_type(StreamViewType::from(view.as_str()))
                            .build()?,
                    )
                    .send()
                    .await
                    .map_err(|e| sdk_error(format!("enabling the stream of {name}"), &e))?;
                tracing::info!(table = name, "enabled the stream");
                continue;
            }
            if let Some(attr) = &def.ttl_attribute {
                enable_ttl(client, name, attr).await?;
            }
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Err(anyhow!(
        "table {name} did not become ACTIVE within a minute"
    ))
}

fn key_schema(keys: &[(String, String)]) -> Result<Vec<KeySchemaElement>> {
    keys.iter()
        .map(|(attr, kind)| {
            Ok(KeySchemaElement::builder()
                .attribute_name(attr)
                .key_type(KeyType::from(kind.as_str()))
                .build()?)
        })
        .collect()
}

fn attribute_definitions(def: &TableDef) -> Result<Vec<AttributeDefinition>> {
    def.attributes
        .iter()
        .map(|(attr, ty)| {
            Ok(AttributeDefinition::builder()
                .attribute_name(attr)
                .attribute_type(ScalarAttributeType::from(ty.as_str()))
                .build()?)
        })
        .collect()
}

fn projection(kind: &str) -> Projection {
    Projection::builder()
        .projection_type(ProjectionType::from(kind))
        .build()
}

/// Enables TTL on `attr` unless it already is.
async fn enable_ttl(client: &Client, name: &str, attr: &str) -> Result<()> {
    let current = client
        .describe_time_to_live()
        .table_name(name)
        .send()
        .await
        .map_err(|e| sdk_error(format!("describing TTL of {name}"), &e))?;
    let enabled = current.time_to_live_description().is_some_and(|d| {
        d.attribute_name() == Some(attr)
            && matches!(
                d.time_to_live_status(),
                Some(TimeToLiveStatus::Enabled | TimeToLiveStatus::Enabling)
            )
    });
    if !enabled {
        let spec = TimeToLiveSpecification::builder()
            .attribute_name(attr)
            .enabled(true)
            .build()?;
        client
            .update_time_to_live()
            .table_name(name)
            .time_to_live_specification(spec)
            .send()
            .await
            .map_err(|e| sdk_error(format!("enabling TTL on {name}"), &e))?;
    }
    Ok(())
}
