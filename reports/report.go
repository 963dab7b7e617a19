package reports

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"html/template"
	"io"
	"os"
	"path/filepath"
	"strings"

	"tier0/bench"
)

// Paths are the files Generate wrote.
type Paths struct {
	// HTML is the single-file report (plots embedded as data URIs).
	HTML string `json:"html"`
	// Markdown is the summary, linking the plots under Images.
	Markdown string `json:"markdown"`
	// Images are the plots as PNG files, for the Markdown summary.
	Images []string `json:"images"`
}

// Generate writes report.html, report.md and img/*.png for res into outDir
// (created if needed) and returns their paths.
func Generate(res *bench.Results, outDir string) (Paths, error) {
	var paths Paths
	if res == nil {
		return paths, fmt.Errorf("reports: no results to report on")
	}
	ref, err := Seed()
	if err != nil {
		return paths, err
	}
	figs, err := Figures(res, ref)
	if err != nil {
		return paths, fmt.Errorf("reports: %w", err)
	}
	imgDir := filepath.Join(outDir, "img")
	if err := os.MkdirAll(imgDir, 0o755); err != nil {
		return paths, fmt.Errorf("reports: creating the output folder: %w", err)
	}
	for _, f := range figs {
		p := filepath.Join(imgDir, f.Name+".png")
		if err := os.WriteFile(p, f.PNG, 0o644); err != nil {
			return paths, fmt.Errorf("reports: %w", err)
		}
		paths.Images = append(paths.Images, p)
	}
	var md bytes.Buffer
	if err := writeMarkdown(&md, res, ref, figs); err != nil {
		return paths, err
	}
	paths.Markdown = filepath.Join(outDir, "report.md")
	if err := os.WriteFile(paths.Markdown, md.Bytes(), 0o644); err != nil {
		return paths, fmt.Errorf("reports: %w", err)
	}
	var html bytes.Buffer
	if err := writeHTML(&html, res, ref, figs); err != nil {
		return paths, err
	}
	paths.HTML = filepath.Join(outDir, "report.html")
	if err := os.WriteFile(paths.HTML, html.Bytes(), 0o644); err != nil {
		return paths, fmt.Errorf("reports: %w", err)
	}
	return paths, nil
}

func title(res *bench.Results) string {
	site := res.Run.Site
	if site == "" {
		site = "unnamed site"
	}
	return "tier0 bench report: " + site
}

func mdCell(s string) string {
	s = strings.ReplaceAll(s, "|", `\|`)
	return strings.ReplaceAll(s, "\n", " ")
}

func writeMarkdown(w io.Writer, res *bench.Results, ref *Reference, figs []Figure) error {
	var b strings.Builder
	fmt.Fprintf(&b, "# %s\n\n", title(res))
	for _, l := range runSummary(res) {
		fmt.Fprintf(&b, "%s\n", l)
	}
	for _, t := range buildTables(res, ref) {
		fmt.Fprintf(&b, "\n## %s\n\n", t.Title)
		hdr := make([]string, len(t.Header))
		sep := make([]string, len(t.Header))
		for i, h := range t.Header {
			hdr[i] = mdCell(h)
			sep[i] = "---"
		}
		fmt.Fprintf(&b, "| %s |\n| %s |\n", strings.Join(hdr, " | "), strings.Join(sep, " | "))
		for _, r := range t.Rows {
			cells := make([]string, len(r))
			for i, c := range r {
				cells[i] = mdCell(c)
			}
			fmt.Fprintf(&b, "| %s |\n", strings.Join(cells, " | "))
		}
		if t.Note != "" {
			fmt.Fprintf(&b, "\n%s\n", t.Note)
		}
	}
	if len(figs) > 0 {
		b.WriteString("\n## Plots\n")
		for _, f := range figs {
			fmt.Fprintf(&b, "\n![%s](img/%s.png)\n\n%s\n", f.Title, f.Name, f.Caption)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

type htmlFigure struct {
	Title, Caption string
	Src            template.URL
}

type htmlData struct {
	Title   string
	Summary []string
	Tables  []table
	Figures []htmlFigure
	Checks  string
}

var htmlTmpl = template.Must(template.New("report").Funcs(template.FuncMap{
	"statusClass": func(s string) string {
		switch s {
		case "PASS":
			return "pass"
		case "FAIL":
			return "fail"
		case "NOT RUN":
			return "notrun"
		}
		return ""
	},
}).Parse(`<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{{.Title}}</title>
<style>
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1em}
th,td{border:1px solid #ccc;padding:.25em .6em;text-align:left;vertical-align:top;font-size:.92em}
th{background:#f2f2f2}
td.pass{background:#e3f5e1;font-weight:bold}
td.fail{background:#fbe0e0;font-weight:bold}
td.notrun{background:#fff4d6;font-weight:bold}
.note{color:#555;font-size:.9em}
figure{margin:1em 0}
figcaption{color:#555;font-size:.9em}
img{max-width:100%}
</style></head><body>
<h1>{{.Title}}</h1>
{{range .Summary}}<p>{{.}}</p>
{{end}}<p><b>Checks:</b> {{.Checks}}</p>
{{range .Tables}}<h2>{{.Title}}</h2>
<table><thead><tr>{{range .Header}}<th>{{.}}</th>{{end}}</tr></thead><tbody>
{{range .Rows}}<tr>{{range .}}<td{{with statusClass .}} class="{{.}}"{{end}}>{{.}}</td>{{end}}</tr>
{{end}}</tbody></table>
{{with .Note}}<p class="note">{{.}}</p>{{end}}
{{end}}{{if .Figures}}<h2>Plots</h2>
{{range .Figures}}<figure><img alt="{{.Title}}" src="{{.Src}}"><figcaption>{{.Caption}}</figcaption></figure>
{{end}}{{end}}</body></html>
`))

func writeHTML(w io.Writer, res *bench.Results, ref *Reference, figs []Figure) error {
	d := htmlData{Title: title(res), Summary: runSummary(res), Tables: buildTables(res, ref), Checks: checkSummary(res)}
	for _, f := range figs {
		d.Figures = append(d.Figures, htmlFigure{Title: f.Title, Caption: f.Caption,
			Src: template.URL("data:image/png;base64," + base64.StdEncoding.EncodeToString(f.PNG))})
	}
	if err := htmlTmpl.Execute(w, d); err != nil {
		return fmt.Errorf("reports: rendering HTML: %w", err)
	}
	return nil
}
