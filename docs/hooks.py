"""MkDocs hooks of comgra's site: the REST reference, written from the OpenAPI document the server serves
(``comgra.server.api_spec``), and pages that are in ``docs/`` but not in the nav added to it under "More"."""
from __future__ import annotations

import json
from typing import Any

from mkdocs.structure.files import File, Files

REST_PAGE = "reference/rest.md"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _schema_text(schema: dict[str, Any]) -> str:
    return json.dumps(schema, sort_keys=True).replace("|", "\\|")


def rest_reference(document: dict[str, Any]) -> str:
    """The REST reference as Markdown: one section per route and method, its parameters and answers."""
    out = [f"# REST reference\n\n{document['info']['title']} {document['info']['version']}, "
           "generated from the OpenAPI document the server serves at `/api/v1/openapi.json` "
           "(`comgra.server.api_spec`). The guide to the API is on [REST API](../rest-api.md).\n"]
    for path, item in document["paths"].items():
        shared = item.get("parameters", [])
        for method, operation in item.items():
            if method == "parameters":
                continue
            out.append(f"## `{method.upper()} {path}`\n\n{operation.get('summary', '')}\n")
            if operation.get("description"):
                out.append(operation["description"] + "\n")
            parameters = [*shared, *operation.get("parameters", [])]
            if parameters:
                out.append("| parameter | in | required | schema | meaning |\n|---|---|---|---|---|")
                for parameter in parameters:
                    out.append(f"| `{parameter['name']}` | {parameter['in']} | "
                               f"{'yes' if parameter.get('required') else 'no'} | "
                               f"`{_schema_text(parameter.get('schema', {}))}` | "
                               f"{_cell(parameter.get('description', ''))} |")
                out.append("")
            body = operation.get("requestBody", {}).get("content", {}).get("application/json", {})
            if body:
                out.append(f"Request body: `{_schema_text(body.get('schema', {}))}`\n")
            out.append("| status | answer |\n|---|---|")
            for status, response in operation.get("responses", {}).items():
                out.append(f"| {status} | {_cell(response.get('description', ''))} |")
            out.append("")
    return "\n".join(out) + "\n"


def on_files(files: Files, config: Any) -> Files:
    from comgra.server.api_spec import openapi_document
    files.append(File.generated(config, REST_PAGE, content=rest_reference(openapi_document())))
    return files


def on_nav(nav: Any, config: Any, files: Files) -> Any:
    """A page in docs/ that the nav does not list (one another branch brought) is added under "More"."""
    from mkdocs.structure.nav import Section
    from mkdocs.structure.pages import Page

    listed = {page.file.src_uri for page in nav.pages}
    extra = [file for file in files.documentation_pages() if file.src_uri not in listed]
    if extra:
        pages = [file.page or Page(None, file, config) for file in sorted(extra, key=lambda f: f.src_uri)]
        section = Section("More", pages)
        nav.items.append(section)
        nav.pages.extend(pages)
    return nav
