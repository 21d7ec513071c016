package avro

import (
	"testing"
)

// Tests from the review of the codec copy (codecText), each of which failed
// before its fix.

// A non-union decimal field with a default (AvroData's string of bytes),
// missing from a payload: goavro takes the default, which the copy keeps
// (it dropped it at first: a dead letter).
func TestCodecKeepsDecimalDefault(t *testing.T) {
	schema := `{"type":"record","name":"R","fields":[
	  {"name":"id","type":"int"},
	  {"name":"amount","type":{"type":"bytes","logicalType":"decimal","precision":10,"scale":2},"default":"\u0001"}]}`
	got, err := native(t, schema, `{"id": 1}`)
	t.Logf("got %#v err %v", got, err)
	if err != nil {
		t.Errorf("missing decimal field with a default: %v", err)
	}
}

// Short-name reference inside a renamed namespace, in unions.
func TestCodecShortRefInRenamedNamespace(t *testing.T) {
	schema := `{"type":"record","name":"Commande","namespace":"café.été","fields":[
	  {"name":"a","type":["null",{"type":"record","name":"Ligne","fields":[{"name":"qté","type":"int"}]}],"default":null},
	  {"name":"b","type":["null","Ligne"],"default":null},
	  {"name":"c","type":["null",{"type":"record","name":"X","namespace":"","fields":[{"name":"n","type":"int"}]}],"default":null},
	  {"name":"d","type":["null","X"],"default":null}]}`
	got, err := native(t, schema, `{"a":{"qté":1},"b":{"qté":2},"c":{"n":3},"d":{"n":4}}`)
	t.Logf("got %#v err %v", got, err)
	if err != nil {
		t.Error(err)
	}
}

// A field literally named as another's goavro name.
func TestCodecNamesDoNotCollide(t *testing.T) {
	schema := `{"type":"record","name":"R","fields":[{"name":"é","type":"int"},{"name":"u_c3a9","type":"int"}]}`
	if _, err := compile(schema); err != nil {
		t.Errorf("compile: %v", err)
	}
}

// A payload key equal to a renamed field's goavro name is taken as that field.
func TestCodecKeyCannotPassForRenamedField(t *testing.T) {
	schema := `{"type":"record","name":"R","fields":[{"name":"é","type":"int"}]}`
	got, err := native(t, schema, `{"u_c3a9": 5}`)
	t.Logf("got %#v err %v", got, err)
	if err == nil {
		t.Errorf("a payload without field é was written as é=5")
	}
	got, err = native(t, schema, `{"é": 1, "u_c3a9": 5}`)
	t.Logf("got %#v err %v", got, err)
	if err == nil {
		t.Errorf("an unknown key was taken (%#v)", got)
	}
}
