// Package webtest reads slotwatch's status page back for tests: it parses
// the page as XML (the page is written to be well-formed, so a strict
// parser catches broken markup) and returns its table rows by slot.
package webtest

import (
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// Row is one row of the status table.
type Row struct {
	Server string
	Slot   string
	// Level is the row's class: ok, warn, crit or down.
	Level string
	// Cells maps each column header to the cell's text.
	Cells map[string]string
	// SparkPoints is the number of points of the row's sparkline (0: none).
	SparkPoints int
}

// Page is the parsed status page.
type Page struct {
	Title   string
	Summary string
	// Firing lists the text of the firing-alerts list items.
	Firing []string
	// Rows by slot name; a server-wide row (unreachable, no slots) is under
	// "server/" plus the server's name.
	Rows map[string]Row
	// External counts references to other origins (scripts, styles,
	// images): the page must be self-contained.
	External int
}

// Parse reads a status page.
func Parse(r io.Reader) (*Page, error) {
	d := xml.NewDecoder(r)
	d.Strict = true
	d.Entity = xml.HTMLEntity
	p := &Page{Rows: map[string]Row{}}
	var (
		stack   []string
		headers []string
		row     *Row
		col     int
		cell    strings.Builder
		inCell  bool
		inTitle bool
		inSum   bool
		inLI    bool
		li      strings.Builder
		span    int
	)
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("status page is not well-formed: %w", err)
		}
		switch t := tok.(type) {
		case xml.StartElement:
			name := t.Name.Local
			stack = append(stack, name)
			attr := func(k string) string {
				for _, a := range t.Attr {
					if a.Name.Local == k {
						return a.Value
					}
				}
				return ""
			}
			for _, k := range []string{"src", "href"} {
				if v := attr(k); strings.Contains(v, "//") && name != "a" && name != "svg" {
					p.External++
				}
			}
			switch name {
			case "title":
				inTitle = true
			case "p":
				inSum = attr("id") == "summary"
			case "li":
				inLI = true
				li.Reset()
			case "tr":
				if attr("data-level") != "" {
					row = &Row{Server: attr("data-server"), Slot: attr("data-slot"), Level: attr("data-level"), Cells: map[string]string{}}
					col = 0
				}
			case "th", "td":
				inCell = true
				cell.Reset()
				span = 1
				if cs := attr("colspan"); cs != "" {
					span, _ = strconv.Atoi(cs)
				}
			case "polyline":
				if row != nil {
					row.SparkPoints = len(strings.Fields(attr("points")))
				}
			}
		case xml.EndElement:
			name := t.Name.Local
			if len(stack) == 0 || stack[len(stack)-1] != name {
				return nil, fmt.Errorf("status page: </%s> closes <%s>", name, strings.Join(stack, "><"))
			}
			stack = stack[:len(stack)-1]
			switch name {
			case "title":
				inTitle = false
			case "p":
				inSum = false
			case "li":
				inLI = false
				p.Firing = append(p.Firing, strings.TrimSpace(li.String()))
			case "th":
				inCell = false
				headers = append(headers, strings.TrimSpace(cell.String()))
			case "td":
				inCell = false
				if row != nil && col < len(headers) {
					row.Cells[headers[col]] = strings.TrimSpace(cell.String())
				}
				col += span
			case "tr":
				if row != nil {
					key := row.Slot
					if key == "" {
						key = "server/" + row.Server
					}
					p.Rows[key] = *row
					row = nil
				}
			}
		case xml.CharData:
			switch {
			case inCell:
				cell.Write(t)
			case inTitle:
				p.Title += string(t)
			}
			if inSum {
				p.Summary += string(t)
			}
			if inLI {
				li.Write(t)
			}
		}
	}
	if len(stack) != 0 {
		return nil, fmt.Errorf("status page: unclosed <%s>", strings.Join(stack, "><"))
	}
	if len(headers) == 0 {
		return nil, errors.New("status page has no table header")
	}
	return p, nil
}
